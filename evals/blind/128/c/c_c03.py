"""Fabric distillation: a frozen teacher (32 classes) into a student whose
classifier was grown to 40 classes. Two optimizers (AdamW body, SGD head),
ranks with different micro-batch sizes (6 and 4 rows), K = 2 with each
epoch ending in a 1-micro-batch window; every window is normalised by its
own all-ranks row count.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


@dataclass
class Cfg:
    in_dim: int = 20
    hidden: int = 48
    old_classes: int = 32
    classes: int = 40
    micro_per_epoch: int = 5          # windows 2, 2, 1
    accum: int = 2
    epochs: int = 3
    temperature: float = 2.0
    alpha: float = 0.5
    body_lr: float = 3e-3
    head_lr: float = 0.05
    seed: int = 5


class Student(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.in_dim, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU())
        self.head = nn.Linear(cfg.hidden, cfg.old_classes)

    def grow_head(self, n):
        old = self.head
        new = nn.Linear(old.in_features, n)
        with torch.no_grad():
            new.weight[: old.out_features] = old.weight
            new.bias[: old.out_features] = old.bias
            new.weight[old.out_features:].normal_(0, 0.02)
            new.bias[old.out_features:].zero_()
        self.head = new

    def forward(self, x):
        return self.head(self.body(x))


def main():
    cfg = Cfg()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)
    torch.use_deterministic_algorithms(True)
    rank, W = fabric.global_rank, fabric.world_size

    teacher = nn.Sequential(nn.Linear(cfg.in_dim, 64), nn.Tanh(), nn.Linear(64, cfg.old_classes))
    teacher.eval().requires_grad_(False)             # never set up: frozen, local

    student = Student(cfg)
    student.grow_head(cfg.classes)
    opt_body = torch.optim.AdamW(student.body.parameters(), lr=cfg.body_lr, weight_decay=0.01)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=cfg.head_lr, momentum=0.9)
    model, opt_body, opt_head = fabric.setup(student, opt_body, opt_head)

    micro_rows = 6 if rank == 0 else 4
    g = torch.Generator().manual_seed(cfg.seed * 100 + rank)
    n = micro_rows * cfg.micro_per_epoch
    xs = torch.randn(n, cfg.in_dim, generator=g)
    ys = torch.randint(0, cfg.classes, (n,), generator=g)
    batches = [(xs[i:i + micro_rows], ys[i:i + micro_rows]) for i in range(0, n, micro_rows)]

    T = cfg.temperature
    step = 0
    for epoch in range(cfg.epochs):
        for w0 in range(0, len(batches), cfg.accum):
            window = batches[w0:w0 + cfg.accum]
            rows = fabric.all_reduce(torch.tensor(float(sum(len(y) for _, y in window))), reduce_op="sum")
            for i, (x, y) in enumerate(window):
                last = i == len(window) - 1
                with fabric.no_backward_sync(model, enabled=not last):
                    logits = model(x)
                    with torch.no_grad():
                        t_logits = teacher(x)
                    ce = F.cross_entropy(logits, y, reduction="sum")
                    kd = F.kl_div(F.log_softmax(logits[:, : cfg.old_classes] / T, -1),
                                  F.log_softmax(t_logits / T, -1), log_target=True, reduction="sum") * T * T
                    loss = ((1 - cfg.alpha) * ce + cfg.alpha * kd) * W / rows
                    fabric.backward(loss)
            opt_body.step()
            opt_head.step()
            opt_body.zero_grad()
            opt_head.zero_grad()
            step += 1
        if rank == 0:
            print(f"epoch {epoch} steps {step} last loss/row {loss.item() * rows.item() / W / len(y):.4f}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
