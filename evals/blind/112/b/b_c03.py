"""Regression head fine-tuning with Accelerate (2 ranks, K=4), run_*_no_trainer style."""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import get_scheduler


@dataclass
class Cfg:
    n: int = 144
    batch: int = 4
    grad_accum: int = 3
    epochs: int = 3
    lr: float = 5e-3
    warmup: int = 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = Cfg()
    acc = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=True, mixed_precision="bf16")
    set_seed(0)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(cfg.n, 12, generator=g)
    y = (x[:, :3].sum(-1) + 0.1 * torch.randn(cfg.n, generator=g))
    loader = DataLoader(TensorDataset(x, y), batch_size=cfg.batch, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(1))
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)

    updates_per_epoch = math.ceil(len(loader) / acc.num_processes / cfg.grad_accum)
    max_train_steps = updates_per_epoch * cfg.epochs
    # the prepared scheduler skips non-sync micro-batches and steps once per process
    sched_scale = acc.num_processes
    sched = get_scheduler("linear", optimizer=opt,
                          num_warmup_steps=cfg.warmup * sched_scale,
                          num_training_steps=max_train_steps * sched_scale)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)

    for epoch in range(cfg.epochs):
        model.train()
        for xb, yb in loader:
            with acc.accumulate(model):
                loss = nn.functional.mse_loss(model(xb), yb)
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
    if acc.is_main_process:
        print("last lr", sched.get_last_lr())
        print("FINAL_SHA256", digest(acc.unwrap_model(model)))


if __name__ == "__main__":
    main()
