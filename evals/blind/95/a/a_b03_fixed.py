"""Accelerate trainer class for a small next-token model, with periodic validation.

Usage: torchrun --nproc-per-node 2 a_b03.py
"""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed


@dataclass
class TrainConfig:
    vocab_size: int = 48
    d_model: int = 32
    context: int = 8
    micro_batch: int = 4
    accumulation_steps: int = 4
    epochs: int = 2
    lr: float = 2e-3
    warmup: int = 3
    eval_every: int = 2
    n_train: int = 192
    n_val: int = 12
    seed: int = 2024


class ToyCorpus(Dataset):
    def __init__(self, n, cfg, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, cfg.vocab_size, (n, cfg.context + 1), generator=g)
        self.x[:, 1::2] = (self.x[:, 0::2][:, : self.x[:, 1::2].shape[1]] * 3 + 1) % cfg.vocab_size

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i, :-1], self.x[i, 1:]


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.context, cfg.d_model))
        self.mlp = nn.Sequential(nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, 2 * cfg.d_model), nn.GELU(),
                                 nn.Linear(2 * cfg.d_model, cfg.d_model))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, idx):
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        h = h + self.mlp(h)
        return self.lm_head(h)


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


class Runner:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        plugin = GradientAccumulationPlugin(num_steps=cfg.accumulation_steps)
        self.accelerator = Accelerator(gradient_accumulation_plugin=plugin, cpu=True)
        set_seed(cfg.seed)
        model = TinyLM(cfg)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
        train_loader = DataLoader(ToyCorpus(cfg.n_train, cfg, 1), batch_size=cfg.micro_batch, shuffle=True,
                                  generator=torch.Generator().manual_seed(cfg.seed))
        # the validation set is tiny: every rank scores all of it
        self.val_loader = DataLoader(ToyCorpus(cfg.n_val, cfg, 2), batch_size=cfg.micro_batch)
        steps_per_epoch = math.ceil(len(train_loader) / self.accelerator.num_processes / cfg.accumulation_steps)
        total = steps_per_epoch * cfg.epochs * self.accelerator.num_processes
        warm = cfg.warmup * self.accelerator.num_processes
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warm) * max(0.1, 1 - s / total))
        self.model, self.optimizer, self.train_loader, self.scheduler = self.accelerator.prepare(
            model, optimizer, train_loader, scheduler)
        self.updates = 0

    def compute_loss(self, batch):
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def micro_step(self, batch, train=True):
        with self.accelerator.accumulate(self.model):
            loss = self.compute_loss(batch)
            if train:
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
        return loss.detach()

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        losses = [self.compute_loss(batch) for batch in self.val_loader]
        self.model.train()
        return torch.stack(losses).mean().item()

    def fit(self):
        self.model.train()
        for epoch in range(self.cfg.epochs):
            for batch in self.train_loader:
                loss = self.micro_step(batch)
                if self.accelerator.sync_gradients:
                    self.updates += 1
                    if self.updates % self.cfg.eval_every == 0:
                        val = self.evaluate()
                        self.accelerator.print(f"update {self.updates} train {loss.item():.4f} val {val:.4f}")
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            print("FINAL_SHA256", sha_of(self.accelerator.unwrap_model(self.model)))
        self.accelerator.end_training()


if __name__ == "__main__":
    Runner(TrainConfig()).fit()
