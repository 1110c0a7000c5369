# SFT of a tiny Llama with the HF Trainer; a Trainer subclass adds an L2-SP penalty (pull towards the start weights)
import hashlib

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

PROMPT_LEN = 6


class PromptCompletion(Dataset):
    def __init__(self, n, seq_len=20, vocab=128, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, seq_len), generator=g)
        self.plen = torch.randint(3, 12, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: int(self.plen[i])] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


class L2SPTrainer(Trainer):
    def __init__(self, *args, l2sp_coef=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.l2sp_coef = l2sp_coef
        self.anchor = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def l2sp_penalty(self, model):
        total = 0.0
        for n, p in model.named_parameters():
            if n.startswith("module."):
                n = n[len("module."):]
            if n in self.anchor:
                total = total + (p - self.anchor[n]).pow(2).sum()
        return self.l2sp_coef * total

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        # the penalty belongs to the optimizer step, not to each micro-batch
        loss = loss + self.l2sp_penalty(model) / self.current_gradient_accumulation_steps
        return (loss, outputs) if return_outputs else loss


def main():
    set_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir="/tmp/blind89_a_b03_out", per_device_train_batch_size=4, gradient_accumulation_steps=4,
        num_train_epochs=1, learning_rate=3e-3, lr_scheduler_type="linear", warmup_steps=2,
        max_grad_norm=1.0, weight_decay=0.0, logging_strategy="no", save_strategy="no", report_to="none",
        use_cpu=True, seed=0, data_seed=0, ddp_backend="gloo", dataloader_num_workers=0,
        average_tokens_across_devices=True,
    )
    trainer = L2SPTrainer(model=model, args=args, train_dataset=PromptCompletion(2 * 4 * 4 * 10), l2sp_coef=0.5)
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
