"""SFT of a tiny Llama with the HF Trainer, our own AdamW + linear warm-up/decay schedule.

2 ranks (torchrun), gradient accumulation 3, bf16 off, CPU/gloo.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments,
                          default_data_collator, get_linear_schedule_with_warmup, set_seed)


@dataclass
class RunConfig:
    seed: int = 1234
    n_train: int = 96
    seq_len: int = 16
    prompt_len: int = 5
    vocab: int = 96
    per_device_bs: int = 2
    grad_accum: int = 3
    epochs: int = 3
    lr: float = 3e-3
    warmup_steps: int = 2
    weight_decay: float = 0.01


class SyntheticSFT(Dataset):
    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(cfg.seed + 7)
        self.ids = torch.randint(3, cfg.vocab, (cfg.n_train, cfg.seq_len), generator=g)
        # a learnable pattern: the answer copies the prompt shifted by one
        self.ids[:, cfg.prompt_len:] = (self.ids[:, : cfg.seq_len - cfg.prompt_len] + 1) % cfg.vocab
        self.prompt_len = cfg.prompt_len

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: self.prompt_len] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def build_model(cfg: RunConfig):
    mcfg = LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(mcfg)


def build_optimizer_and_schedule(model, cfg: RunConfig, n_train: int):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW([
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ], lr=cfg.lr, betas=(0.9, 0.95))
    steps_per_epoch = n_train // cfg.per_device_bs
    total_steps = cfg.epochs * steps_per_epoch
    sched = get_linear_schedule_with_warmup(opt, cfg.warmup_steps, total_steps)
    return opt, sched


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    model = build_model(cfg)
    train_ds = SyntheticSFT(cfg)
    optimizer, scheduler = build_optimizer_and_schedule(model, cfg, len(train_ds))

    args = TrainingArguments(
        output_dir="tmp_scratch/b_b01_out",
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        max_grad_norm=0.0,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds,
                      data_collator=default_data_collator, optimizers=(optimizer, scheduler))
    trainer.train()

    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {params_sha256(trainer.model)}", flush=True)
        torch.save({n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                   f"tmp_scratch/{os.path.splitext(os.path.basename(__file__))[0]}.pt")


if __name__ == "__main__":
    main()
