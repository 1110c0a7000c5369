"""Logit distillation of a small student from a frozen teacher with Lightning Fabric.

Windows are read ahead from the loader so the student update sees K micro-batches
at once; the teacher is never set up (frozen, inference only).
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from lightning_fabric import Fabric


@dataclass
class DistillConfig:
    vocab: int = 32
    d_in: int = 20
    teacher_hidden: int = 128
    student_hidden: int = 32
    micro_batch: int = 8
    grad_accum: int = 4
    steps: int = 20
    lr: float = 2e-3
    temperature: float = 2.0
    alpha: float = 0.7          # weight of the KD term, 1 - alpha on the hard labels
    seed: int = 2024


def mlp(d_in, hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, d_out))


class Distiller:
    def __init__(self, cfg: DistillConfig, fabric: Fabric):
        self.cfg, self.fabric = cfg, fabric
        torch.manual_seed(cfg.seed)
        self.teacher = mlp(cfg.d_in, cfg.teacher_hidden, cfg.vocab).eval().requires_grad_(False)
        self.teacher.to(fabric.device)
        student = mlp(cfg.d_in, cfg.student_hidden, cfg.vocab)
        opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.student, self.opt = fabric.setup(student, opt)

    def distill_loss(self, x, y):
        T = self.cfg.temperature
        with torch.no_grad():
            t_logits = self.teacher(x)
        s_logits = self.student(x)
        kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1),
                      reduction="batchmean", log_target=True) * T * T
        ce = F.cross_entropy(s_logits, y)
        return self.cfg.alpha * kd + (1 - self.cfg.alpha) * ce

    def train_window(self, window):
        k = len(window)
        # skip the gradient all-reduce while we accumulate: only pay for it once per window
        with self.fabric.no_backward_sync(self.student, enabled=k > 1):
            for x, y in window:
                loss = self.distill_loss(x, y) / k
                self.fabric.backward(loss)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach() * k

    def fit(self, loader):
        it = iter(loader)
        for step in range(self.cfg.steps):
            window = [next(it) for _ in range(self.cfg.grad_accum)]
            last = self.train_window(window)
            if step % 5 == 0:
                self.fabric.print(f"step {step} loss {last.item():.4f}")


def make_data(cfg: DistillConfig):
    n = 2 * cfg.steps * cfg.grad_accum * cfg.micro_batch
    g = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(n, cfg.d_in, generator=g)
    y = torch.randint(0, cfg.vocab, (n,), generator=g)
    return TensorDataset(x, y)


def main():
    cfg = DistillConfig()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)
    trainer = Distiller(cfg, fabric)
    loader = fabric.setup_dataloaders(DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=False))
    trainer.fit(loader)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.student.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
