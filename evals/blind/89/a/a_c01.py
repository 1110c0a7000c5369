# HF Trainer on a tiny Llama: completion-only labels, a frozen embedding, two AdamW groups, a clip that acts
# and an epoch whose last window is short (the Trainer normalises over num_items_in_batch of that window)
import hashlib

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed


class Completions(Dataset):
    def __init__(self, n, seq_len=18, vocab=100, seed=11):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, seq_len), generator=g)
        self.plen = torch.randint(2, 14, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: int(self.plen[i])] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


class GroupedTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            decay, no_decay = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (no_decay if ("norm" in n or n.endswith("bias")) else decay).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                lr=self.args.learning_rate, betas=(0.9, 0.98))
        return self.optimizer


def main():
    set_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.get_input_embeddings().weight.requires_grad_(False)
    # 2 ranks x 3 per device = 6 per micro-step; 75 samples -> 13 micro-batches per rank, K=3: 4 full windows + 1
    args = TrainingArguments(
        output_dir="/tmp/blind89_a_c01_out", per_device_train_batch_size=3, gradient_accumulation_steps=3,
        num_train_epochs=2, learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=1,
        max_grad_norm=0.3, logging_strategy="no", save_strategy="no", report_to="none",
        use_cpu=True, seed=0, data_seed=0, ddp_backend="gloo",
    )
    trainer = GroupedTrainer(model=model, args=args, train_dataset=Completions(75))
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
