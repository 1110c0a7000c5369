"""Stock HF Trainer: masked-prompt SFT, 3-3-1 windows per epoch, frozen embedding, own two-group optimizer, clip."""
import hashlib
import os

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed


class PromptDataset(Dataset):
    def __init__(self, n=56, seq=16, vocab=128, seed=21):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, seq), generator=g)
        self.plen = torch.randint(2, 12, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        lab = self.ids[i].clone()
        lab[: self.plen[i]] = -100
        return {"input_ids": self.ids[i], "labels": lab}


def main():
    set_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.model.embed_tokens.weight.requires_grad_(False)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0, "lr": 1e-3}], lr=3e-3)
    args = TrainingArguments(
        output_dir="tmp_scratch/c02_out",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,   # 7 micro-batches per rank per epoch -> windows of 3, 3, 1
        num_train_epochs=3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        max_grad_norm=0.3,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        ddp_backend="gloo",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptDataset(), optimizers=(opt, None))
    trainer.train()

    rank = dist.get_rank() if dist.is_initialized() else 0
    m = trainer.accelerator.unwrap_model(trainer.model)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
