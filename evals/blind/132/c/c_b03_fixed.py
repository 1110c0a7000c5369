"""Fabric feature distillation: a small student regresses a frozen teacher's
hidden features and matches its soft labels.

Launched with torchrun (Fabric reads the ranks from the environment).
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class TrainConfig:
    in_dim: int = 48
    teacher_hidden: int = 128
    student_hidden: int = 64
    classes: int = 12
    micro_batch: int = 8
    grad_accum: int = 4
    iterations: int = 24
    lr: float = 1e-3
    feat_weight: float = 0.5
    temperature: float = 3.0
    seed: int = 11


class Teacher(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.in_dim, cfg.teacher_hidden), nn.Tanh(),
                                  nn.Linear(cfg.teacher_hidden, cfg.teacher_hidden), nn.Tanh())
        self.cls = nn.Linear(cfg.teacher_hidden, cfg.classes)

    def forward(self, x):
        h = self.body(x)
        return h, self.cls(h)


class Student(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.in_dim, cfg.student_hidden), nn.GELU(),
                                  nn.Linear(cfg.student_hidden, cfg.student_hidden), nn.GELU())
        self.proj = nn.Linear(cfg.student_hidden, cfg.teacher_hidden)  # hint regressor
        self.cls = nn.Linear(cfg.student_hidden, cfg.classes)

    def forward(self, x):
        h = self.body(x)
        return self.proj(h), self.cls(h)


class DistillTrainer:
    def __init__(self, cfg: TrainConfig, fabric: Fabric):
        self.cfg = cfg
        self.fabric = fabric
        self.teacher = Teacher(cfg).eval().requires_grad_(False)
        student = Student(cfg)
        opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.student, self.opt = fabric.setup(student, opt)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / 4))
        self.iter_num = 0

    def loss_fn(self, x):
        with torch.no_grad():
            t_feat, t_logits = self.teacher(x)
        s_feat, s_logits = self.student(x)
        T = self.cfg.temperature
        kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1),
                      log_target=True, reduction="batchmean") * T * T
        hint = F.mse_loss(s_feat, t_feat)
        return kd + self.cfg.feat_weight * hint

    def train_step(self, micro_batches):
        """Forward/backward over one accumulation window of micro-batches."""
        n = len(micro_batches)
        for k, (x,) in enumerate(micro_batches):
            is_accumulating = k < n - 1
            with self.fabric.no_backward_sync(self.student, enabled=is_accumulating):
                loss = self.loss_fn(x) / n
                self.fabric.backward(loss)
        return loss.detach() * n

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()

    def fit(self, loader):
        it = iter(loader)
        for _ in range(self.cfg.iterations):
            window = [next(it) for _ in range(self.cfg.grad_accum)]
            loss = self.train_step(window)
            self.optimizer_step()
            self.iter_num += 1
            if self.fabric.global_rank == 0 and self.iter_num % 6 == 0:
                print(f"iter {self.iter_num} loss {loss.item():.4f}", flush=True)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = TrainConfig()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)
    n = cfg.micro_batch * cfg.grad_accum * cfg.iterations * fabric.world_size
    x = torch.randn(n, cfg.in_dim, generator=torch.Generator().manual_seed(cfg.seed))
    loader = fabric.setup_dataloaders(
        DataLoader(TensorDataset(x), batch_size=cfg.micro_batch, shuffle=False))
    trainer = DistillTrainer(cfg, fabric)
    trainer.fit(loader)
    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha256(trainer.student.module)}", flush=True)


if __name__ == "__main__":
    main()
