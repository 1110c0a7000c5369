"""Accelerate loop with bf16 autocast, two AdamW groups, a prepared scheduler and a
preemption/resume in the middle of an epoch (at an optimizer-step boundary) into
freshly built objects via save_state / load_state / skip_first_batches.

The prepared optimizer is cleared after every micro-batch: AcceleratedOptimizer only
acts on zero_grad() when the accumulation window is complete.
"""
import hashlib
import os
import shutil
from dataclasses import dataclass

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import get_linear_schedule_with_warmup


@dataclass(frozen=True)
class Cfg:
    seed: int = 5
    n: int = 256
    dim: int = 16
    micro_bs: int = 4
    accum: int = 4
    epochs: int = 2          # 256 / (4 x 2 ranks) = 32 micro-batches per rank -> 8 windows/epoch
    stop_after_steps: int = 5  # "preempted" after 5 optimizer steps of epoch 0
    lr_body: float = 3e-3
    lr_head: float = 1e-2
    clip: float = 0.5


class Regressor(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        return self.head(self.body(x))


def dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n, cfg.dim, generator=g)
    w = torch.randn(cfg.dim, 3, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(cfg.n, 3, generator=g)
    perm = torch.randperm(cfg.n, generator=g)
    return TensorDataset(x[perm], y[perm])


def build(cfg):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.accum, mixed_precision="bf16")
    set_seed(cfg.seed)
    model = Regressor(cfg.dim)
    opt = torch.optim.AdamW([
        {"params": model.body.parameters(), "lr": cfg.lr_body, "weight_decay": 0.01},
        {"params": model.head.parameters(), "lr": cfg.lr_head, "weight_decay": 0.0},
    ])
    loader = DataLoader(dataset(cfg), batch_size=cfg.micro_bs, shuffle=False)
    steps = cfg.epochs * (len(loader) // accelerator.num_processes // cfg.accum)
    sched = get_linear_schedule_with_warmup(opt, 2 * accelerator.num_processes,
                                            steps * accelerator.num_processes)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    return accelerator, model, opt, loader, sched


def run(cfg, accelerator, model, opt, loader, sched, start_epoch=0, skip=0, stop_after=None):
    done = 0
    for epoch in range(start_epoch, cfg.epochs):
        dl = accelerator.skip_first_batches(loader, skip) if (skip and epoch == start_epoch) else loader
        for x, y in dl:
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    pred = model(x)
                loss = nn.functional.mse_loss(pred.float(), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.clip)
                    done += 1
                opt.step()
                sched.step()
                opt.zero_grad()
            if stop_after is not None and accelerator.sync_gradients and done == stop_after:
                return epoch, done * cfg.accum
    return None, None


def main():
    cfg = Cfg()
    torch.use_deterministic_algorithms(True)
    ckpt = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c02_ckpt")
    acc, model, opt, loader, sched = build(cfg)
    epoch, batches_done = run(cfg, acc, model, opt, loader, sched, stop_after=cfg.stop_after_steps)
    acc.save_state(ckpt)
    acc.wait_for_everyone()
    del model, opt, loader, sched
    acc.free_memory()

    # resume into fresh objects
    acc, model, opt, loader, sched = build(cfg)
    acc.load_state(ckpt)
    run(cfg, acc, model, opt, loader, sched, start_epoch=epoch, skip=batches_done)

    acc.wait_for_everyone()
    flat = torch.cat([p.detach().float().reshape(-1).cpu()
                      for _, p in acc.unwrap_model(model).named_parameters()])
    if acc.is_main_process:
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")
        shutil.rmtree(ckpt, ignore_errors=True)


if __name__ == "__main__":
    main()
