"""Knowledge distillation (Hinton-style KD + hard-label CE) with a small trainer class.

A frozen teacher MLP, a smaller student under DDP on 2 ranks (torchrun), gradient
accumulation with no_sync, a linear warm-up/decay schedule and clipping handled by a small
optimizer wrapper shared with our other training scripts.
"""
import argparse
import hashlib
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class DistillConfig:
    seed: int = 7
    in_dim: int = 32
    n_classes: int = 10
    n_train: int = 512
    micro_batch: int = 16
    grad_accum: int = 4
    epochs: int = 6
    lr: float = 2e-3
    warmup_steps: int = 3
    temperature: float = 2.0
    alpha: float = 0.7
    max_grad_norm: float = 1.0


# --------------------------------------------------------------------------- utils
class AccumulatingOptimizer:
    """Optimizer + scheduler + clipping behind one `step()`.

    Call `step()` / `zero_grad()` after every backward: the wrapped optimizer really steps
    (and the gradients are really cleared) once every `accum_steps` calls, like
    optax.MultiSteps.
    """

    def __init__(self, optimizer, scheduler=None, accum_steps=1, max_grad_norm=None):
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.accum_steps = accum_steps
        self.max_grad_norm = max_grad_norm
        self.num_calls = 0
        self.num_updates = 0
        self._stepped = False

    def step(self):
        self.num_calls += 1
        self._stepped = self.num_calls % self.accum_steps == 0
        if self._stepped:
            if self.max_grad_norm is not None:
                params = [p for g in self.optimizer.param_groups for p in g["params"]]
                torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
            self.num_updates += 1
        return self._stepped

    def zero_grad(self):
        if self._stepped:
            self.optimizer.zero_grad(set_to_none=True)

    def get_last_lr(self):
        return self.scheduler.get_last_lr() if self.scheduler else [g["lr"] for g in self.optimizer.param_groups]


def build_optimizer(model, cfg, total_updates):
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)

    def lr_lambda(step):
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        return max(0.0, (total_updates - step) / max(1, total_updates - cfg.warmup_steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    return AccumulatingOptimizer(opt, sched, accum_steps=cfg.grad_accum,
                                 max_grad_norm=cfg.max_grad_norm)


def mlp(in_dim, hidden, out, depth):
    layers, d = [], in_dim
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), nn.GELU()]
        d = hidden
    return nn.Sequential(*layers, nn.Linear(d, out))


def make_data(cfg, teacher):
    g = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(cfg.n_train, cfg.in_dim, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(-1)
    flip = torch.rand(cfg.n_train, generator=g) < 0.1
    y[flip] = torch.randint(0, cfg.n_classes, (int(flip.sum()),), generator=g)
    return TensorDataset(x, y)


# --------------------------------------------------------------------------- trainer
class DistillTrainer:
    def __init__(self, student, teacher, cfg, rank, world_size):
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.teacher = teacher.eval().requires_grad_(False)
        self.model = DDP(student)

    def distill_loss(self, x, y):
        T = self.cfg.temperature
        s_logits = self.model(x)
        with torch.no_grad():
            t_logits = self.teacher(x)
        kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1),
                      reduction="batchmean", log_target=True) * T * T
        ce = F.cross_entropy(s_logits, y)
        return self.cfg.alpha * kd + (1 - self.cfg.alpha) * ce

    def fit(self, dataset):
        cfg = self.cfg
        sampler = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                                     shuffle=True, seed=cfg.seed)
        loader = DataLoader(dataset, batch_size=cfg.micro_batch, sampler=sampler)
        total_updates = cfg.epochs * (len(loader) // cfg.grad_accum)
        self.opt = build_optimizer(self.model, cfg, total_updates)

        K = cfg.grad_accum
        for epoch in range(cfg.epochs):
            sampler.set_epoch(epoch)
            for i, (x, y) in enumerate(loader):
                sync = (i + 1) % K == 0
                with nullcontext() if sync else self.model.no_sync():
                    loss = self.distill_loss(x, y) / K
                    loss.backward()
                self.opt.step()
                self.opt.zero_grad()
            if self.rank == 0:
                print(f"epoch {epoch} loss {loss.item() * K:.4f} "
                      f"updates {self.opt.num_updates} lr {self.opt.get_last_lr()[0]:.2e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=DistillConfig.epochs)
    args = ap.parse_args()
    cfg = DistillConfig(epochs=args.epochs)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(cfg.seed)
    teacher = mlp(cfg.in_dim, 128, cfg.n_classes, depth=3)
    student = mlp(cfg.in_dim, 32, cfg.n_classes, depth=2)
    dataset = make_data(cfg, teacher)

    trainer = DistillTrainer(student, teacher, cfg, rank, world_size)
    trainer.fit(dataset)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
