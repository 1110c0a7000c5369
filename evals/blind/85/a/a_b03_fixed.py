"""Accelerate fine-tuning of a small residual MLP regressor, 2 processes, grad accumulation 4.

We step the LR schedule ourselves (step_scheduler_with_optimizer=False) so that the
prepared scheduler does not advance once per process.
"""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed


@dataclass
class Cfg:
    seed: int = 1234
    n_samples: int = 384
    dim: int = 24
    hidden: int = 64
    micro_bs: int = 6
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 0.05
    warmup: int = 2
    weight_decay: float = 0.01


class ResMLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.inp = nn.Linear(d, h)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(h), nn.Linear(h, h), nn.GELU()) for _ in range(2)])
        self.out = nn.Linear(h, 1)

    def forward(self, x):
        z = self.inp(x)
        for b in self.blocks:
            z = z + b(z)
        return self.out(z).squeeze(-1)


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.dim, generator=g)
    w = torch.randn(cfg.dim, generator=g)
    y = torch.tanh(x @ w / math.sqrt(cfg.dim)) + 0.1 * torch.randn(cfg.n_samples, generator=g)
    return TensorDataset(x, y)


def linear_warmup_decay(warmup, total):
    def fn(step):
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return fn


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = Cfg()
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, step_scheduler_with_optimizer=False)
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    model = ResMLP(cfg.dim, cfg.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    loader = DataLoader(make_data(cfg), batch_size=cfg.micro_bs, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))

    # optimizer updates per epoch, per process
    updates_per_epoch = math.ceil(len(loader) / accelerator.num_processes / cfg.grad_accum)
    total_updates = updates_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup_decay(cfg.warmup, total_updates))

    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)

    for epoch in range(cfg.epochs):
        model.train()
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(x), y)
                accelerator.backward(loss)
                opt.step()
                if accelerator.sync_gradients:
                    sched.step()
                opt.zero_grad()
        accelerator.print(f"epoch {epoch} loss {loss.item():.5f} lr {sched.get_last_lr()[0]:.5f}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {params_sha(accelerator.unwrap_model(model))}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
