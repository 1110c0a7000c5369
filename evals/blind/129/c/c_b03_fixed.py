"""FitNets-style distillation with Lightning Fabric on 2 CPU ranks.

Student learns from (1) labels, (2) the teacher's softened logits and
(3) a hint loss: a linear regressor maps the student's hidden features to
the teacher's feature width. Gradient accumulation with no_backward_sync.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class DistillConfig:
    in_dim: int = 32
    n_classes: int = 10
    teacher_hidden: int = 96
    student_hidden: int = 48
    n_samples: int = 512
    micro_batch: int = 16
    grad_accum_steps: int = 4
    epochs: int = 2
    lr: float = 3e-3
    temperature: float = 2.0
    alpha_kd: float = 0.5
    beta_hint: float = 1.0
    seed: int = 99


class Teacher(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(c.in_dim, c.teacher_hidden), nn.ReLU(),
                                 nn.Linear(c.teacher_hidden, c.teacher_hidden), nn.ReLU())
        self.head = nn.Linear(c.teacher_hidden, c.n_classes)

    def features(self, x):
        return self.enc(x)

    def forward(self, x):
        f = self.enc(x)
        return f, self.head(f)


class Student(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(c.in_dim, c.student_hidden), nn.ReLU())
        self.head = nn.Linear(c.student_hidden, c.n_classes)
        self.hint = None  # built once the teacher's feature width is known

    def forward(self, x):
        h = self.enc(x)
        return self.hint(h), self.head(h)


def distill_loss(s_hint, s_logits, t_feat, t_logits, y, c):
    ce = F.cross_entropy(s_logits, y)
    kd = F.kl_div(F.log_softmax(s_logits / c.temperature, -1),
                  F.softmax(t_logits / c.temperature, -1),
                  reduction="batchmean") * c.temperature ** 2
    hint = F.mse_loss(s_hint, t_feat)
    return (1 - c.alpha_kd) * ce + c.alpha_kd * kd + c.beta_hint * hint


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    c = DistillConfig()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(c.seed)
    torch.use_deterministic_algorithms(True)

    g = torch.Generator().manual_seed(c.seed)
    x = torch.randn(c.n_samples, c.in_dim, generator=g)
    y = torch.randint(0, c.n_classes, (c.n_samples,), generator=g)
    ds = TensorDataset(x, y)

    teacher = Teacher(c).eval().requires_grad_(False)
    student = Student(c)
    optimizer = torch.optim.AdamW([p for p in student.parameters()], lr=c.lr, weight_decay=0.01)

    # the regressor's output width is whatever the teacher's feature layer emits
    with torch.no_grad():
        t_width = teacher.features(ds.tensors[0][:2]).shape[-1]
    student.hint = nn.Linear(c.student_hidden, t_width)
    optimizer.add_param_group({"params": list(student.hint.parameters())})
    student, optimizer = fabric.setup(student, optimizer)

    loader = fabric.setup_dataloaders(DataLoader(ds, batch_size=c.micro_batch, shuffle=True))
    K = c.grad_accum_steps
    for epoch in range(c.epochs):
        for i, (xb, yb) in enumerate(loader):
            is_accumulating = (i + 1) % K != 0
            with torch.no_grad():
                t_feat, t_logits = teacher(xb)
            with fabric.no_backward_sync(student, enabled=is_accumulating):
                s_hint, s_logits = student(xb)
                loss = distill_loss(s_hint, s_logits, t_feat, t_logits, yb, c) / K
                fabric.backward(loss)
            if not is_accumulating:
                optimizer.step()
                optimizer.zero_grad()

    sha = param_sha(student.module)
    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {sha}")


if __name__ == "__main__":
    main()
