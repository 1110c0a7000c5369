"""Knowledge distillation of a small MLP student from a frozen teacher, DDP on 2 ranks.

Hand-written loop in a trainer class, settings in a dataclass, OneCycle schedule.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class DistillConfig:
    in_dim: int = 32
    n_classes: int = 10
    teacher_hidden: int = 128
    student_hidden: int = 48
    micro_batch: int = 16
    grad_accum: int = 3
    max_steps: int = 12
    max_lr: float = 3e-3
    temperature: float = 2.0
    alpha: float = 0.7
    seed: int = 1234


def make_mlp(d_in, hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, d_out))


def final_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Distiller:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        self.teacher = make_mlp(cfg.in_dim, cfg.teacher_hidden, cfg.n_classes).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        student = make_mlp(cfg.in_dim, cfg.student_hidden, cfg.n_classes)
        self.student = DDP(student)
        self.opt = torch.optim.AdamW(self.student.parameters(), lr=cfg.max_lr, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.OneCycleLR(
            self.opt, max_lr=cfg.max_lr, total_steps=cfg.max_steps * cfg.grad_accum, pct_start=0.25)
        g = torch.Generator().manual_seed(cfg.seed + 17 + rank)
        n = cfg.max_steps * cfg.grad_accum * cfg.micro_batch
        self.x = torch.randn(n, cfg.in_dim, generator=g)
        self.y = torch.randint(0, cfg.n_classes, (n,), generator=g)

    def batches(self):
        mb = self.cfg.micro_batch
        for i in range(0, self.x.shape[0], mb):
            yield self.x[i:i + mb], self.y[i:i + mb]

    def kd_loss(self, x, y):
        T = self.cfg.temperature
        with torch.no_grad():
            t_logits = self.teacher(x)
        s_logits = self.student(x)
        soft = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1),
                        reduction="batchmean") * T * T
        hard = F.cross_entropy(s_logits, y)
        return self.cfg.alpha * soft + (1 - self.cfg.alpha) * hard

    def _micro_step(self, x, y, sync):
        ctx = self.student.no_sync() if not sync else torch.enable_grad()
        with ctx:
            loss = self.kd_loss(x, y) / self.cfg.grad_accum
            loss.backward()
        self.sched.step()
        return loss.detach()

    def _optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        K = self.cfg.grad_accum
        for i, (x, y) in enumerate(self.batches()):
            boundary = (i + 1) % K == 0
            loss = self._micro_step(x, y, sync=boundary)
            if boundary:
                self._optimizer_step()
                step = (i + 1) // K
                if self.rank == 0 and step % 4 == 0:
                    print(f"step {step} loss {loss.item() * K:.4f} lr {self.opt.param_groups[0]['lr']:.2e}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    trainer = Distiller(DistillConfig(), rank, world)
    trainer.fit()
    if rank == 0:
        print(f"FINAL_SHA256 {final_sha256(trainer.student.module)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
