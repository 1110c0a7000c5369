"""Causal-LM fine-tune of a tiny Llama with the HF Trainer on 2 CPU ranks.

Recipe: per-device batch 4, gradient accumulation 2, linear decay with a warm-up
over the first 20% of training, AdamW with the usual no-decay group for norms.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed


@dataclass
class RunConfig:
    vocab: int = 96
    seq_len: int = 24
    n_train: int = 160
    per_device_batch: int = 4
    grad_accum: int = 2
    epochs: int = 2
    lr: float = 3e-3
    weight_decay: float = 0.05
    warmup_frac: float = 0.2
    max_grad_norm: float = 0.0
    seed: int = 1234

    @property
    def warmup_steps(self) -> int:
        # warm up over the first `warmup_frac` of all training steps
        steps_per_epoch = math.ceil(self.n_train / self.per_device_batch)
        return int(self.warmup_frac * steps_per_epoch * self.epochs)


class ToyLM(Dataset):
    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.ids = torch.randint(3, cfg.vocab, (cfg.n_train, cfg.seq_len), generator=g)
        # a simple learnable structure: every odd token repeats the previous one
        self.ids[:, 1::2] = self.ids[:, 0::2]
        lens = torch.randint(cfg.seq_len // 2, cfg.seq_len + 1, (cfg.n_train,), generator=g)
        self.mask = (torch.arange(cfg.seq_len)[None, :] < lens[:, None]).long()

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        ids, m = self.ids[i], self.mask[i]
        labels = ids.masked_fill(m == 0, -100)
        labels[:4] = -100  # prompt tokens are not trained on
        return {"input_ids": ids, "attention_mask": m, "labels": labels}


class GroupedTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            decay, no_decay = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (no_decay if (p.ndim < 2 or "norm" in n) else decay).append(p)
            self.optimizer = torch.optim.AdamW(
                [
                    {"params": decay, "weight_decay": self.args.weight_decay},
                    {"params": no_decay, "weight_decay": 0.0},
                ],
                lr=self.args.learning_rate,
                betas=(0.9, 0.95),
            )
        return self.optimizer


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            tie_word_embeddings=False,
        )
    )
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_b01_out"),
        per_device_train_batch_size=cfg.per_device_batch,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="linear",
        warmup_steps=cfg.warmup_steps,
        max_grad_norm=cfg.max_grad_norm,
        use_cpu=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GroupedTrainer(model=model, args=args, train_dataset=ToyLM(cfg))
    trainer.train()

    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
