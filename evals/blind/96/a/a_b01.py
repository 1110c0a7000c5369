"""SFT of a tiny GPT-2 with the HF Trainer; our own optimizer groups and a cosine schedule
with warm-up live in a Trainer subclass (the recipe's `create_optimizer`/`create_scheduler`)."""
import hashlib
import math
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.optimization import get_cosine_schedule_with_warmup


@dataclass
class RecipeConfig:
    vocab: int = 96
    seq_len: int = 24
    n_examples: int = 128
    per_device_bs: int = 2
    grad_accum: int = 4
    max_steps: int = 12
    lr: float = 3e-3
    warmup_steps: int = 3
    weight_decay: float = 0.05
    seed: int = 1234


class PromptCompletionSet(Dataset):
    """Synthetic prompt/completion pairs; prompt tokens are masked out of the labels."""

    def __init__(self, cfg: RecipeConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.rows = []
        for _ in range(cfg.n_examples):
            ids = torch.randint(3, cfg.vocab, (cfg.seq_len,), generator=g)
            plen = int(torch.randint(4, 12, (1,), generator=g))
            labels = ids.clone()
            labels[:plen] = -100
            self.rows.append({"input_ids": ids, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class RecipeTrainer(Trainer):
    def __init__(self, *a, recipe: RecipeConfig, **kw):
        self.recipe = recipe
        super().__init__(*a, **kw)

    def create_optimizer(self):
        if self.optimizer is None:
            decay, no_decay = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (no_decay if p.ndim < 2 or "ln_" in n else decay).append(p)
            self.optimizer = torch.optim.AdamW(
                [
                    {"params": decay, "weight_decay": self.recipe.weight_decay},
                    {"params": no_decay, "weight_decay": 0.0},
                ],
                lr=self.recipe.lr,
                betas=(0.9, 0.95),
            )
        return self.optimizer

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.lr_scheduler is None:
            # the schedule is defined over every batch the model sees
            total = num_training_steps * self.args.gradient_accumulation_steps
            self.lr_scheduler = get_cosine_schedule_with_warmup(
                optimizer if optimizer is not None else self.optimizer,
                num_warmup_steps=self.recipe.warmup_steps,
                num_training_steps=total,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler


def final_digest(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    cfg = RecipeConfig()
    torch.manual_seed(cfg.seed)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=cfg.vocab, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    )
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_b01"),
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        max_steps=cfg.max_steps,
        learning_rate=cfg.lr,
        max_grad_norm=1.0,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
    )
    trainer = RecipeTrainer(model=model, args=args, train_dataset=PromptCompletionSet(cfg), recipe=cfg)
    trainer.train()
    if trainer.is_world_process_zero():
        print("FINAL_SHA256", final_digest(trainer.model), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
