"""Feature + logit distillation with Lightning Fabric (DDP x 2, bf16-mixed autocast).

- frozen teacher (never wrapped), student with a projection head for feature
  matching; the student's `distill` method is registered with
  `mark_forward_method`, so calling it still goes through DDP's forward;
- two optimizers: AdamW for the backbone/classifier, SGD+momentum for the projector;
- ranks read different micro-batch sizes (3 and 5 rows); 5 micro-batches per epoch
  with ACCUM = 2, so windows are 2, 2, 1; each window is normalised by its own
  all-ranks row count (read ahead), times the world size for DDP's average.
"""
import hashlib
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

CFG = SimpleNamespace(
    in_dim=20, t_hidden=64, s_hidden=32, n_classes=7, rows=(3, 5), micros_per_epoch=5,
    accum=2, epochs=3, lr=3e-3, proj_lr=0.05, temp=2.0, alpha=0.5, beta=0.1, seed=11,
)


class Teacher(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(c.in_dim, c.t_hidden), nn.ReLU(), nn.Linear(c.t_hidden, c.t_hidden), nn.ReLU())
        self.cls = nn.Linear(c.t_hidden, c.n_classes)

    def forward(self, x):
        f = self.body(x)
        return f, self.cls(f)


class Student(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(c.in_dim, c.s_hidden), nn.ReLU())
        self.cls = nn.Linear(c.s_hidden, c.n_classes)
        self.proj = nn.Linear(c.s_hidden, c.t_hidden)  # only used for distillation

    def forward(self, x):
        return self.cls(self.body(x))

    def distill(self, x):
        f = self.body(x)
        return self.proj(f), self.cls(f)


def shard(c, rank):
    g = torch.Generator().manual_seed(c.seed + rank)
    n = c.rows[rank] * c.micros_per_epoch
    x = torch.randn(n, c.in_dim, generator=g)
    y = torch.randint(0, c.n_classes, (n,), generator=g)
    return [(x[i : i + c.rows[rank]], y[i : i + c.rows[rank]]) for i in range(0, n, c.rows[rank])]


def summed_loss(c, s_feat, s_logits, t_feat, t_logits, y):
    ce = F.cross_entropy(s_logits.float(), y, reduction="sum")
    kd = F.kl_div(
        F.log_softmax(s_logits.float() / c.temp, -1), F.log_softmax(t_logits.float() / c.temp, -1),
        log_target=True, reduction="sum",
    ) * c.temp**2
    feat = F.mse_loss(s_feat.float(), t_feat.float(), reduction="none").mean(-1).sum()
    return (1 - c.alpha) * ce + c.alpha * kd + c.beta * feat


def main():
    c = CFG
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed")
    fabric.launch()
    fabric.seed_everything(c.seed)

    teacher = Teacher(c).eval().requires_grad_(False)
    student = Student(c)
    main_params = [p for n, p in student.named_parameters() if not n.startswith("proj.")]
    opt_main = torch.optim.AdamW(main_params, lr=c.lr, weight_decay=0.01)
    opt_proj = torch.optim.SGD(student.proj.parameters(), lr=c.proj_lr, momentum=0.9)
    student, opt_main, opt_proj = fabric.setup(student, opt_main, opt_proj)
    student.mark_forward_method("distill")
    teacher = fabric.to_device(teacher)

    data = shard(c, fabric.global_rank)
    for epoch in range(c.epochs):
        for start in range(0, len(data), c.accum):
            window = data[start : start + c.accum]
            rows = fabric.all_reduce(torch.tensor(float(sum(len(y) for _, y in window))), reduce_op="sum")
            for m, (x, y) in enumerate(window):
                with fabric.no_backward_sync(student, enabled=m < len(window) - 1):
                    with torch.no_grad():
                        t_feat, t_logits = teacher(x)
                    s_feat, s_logits = student.distill(x)
                    loss = summed_loss(c, s_feat, s_logits, t_feat, t_logits, y) * fabric.world_size / rows
                    fabric.backward(loss)
            opt_main.step()
            opt_proj.step()
            opt_main.zero_grad()
            opt_proj.zero_grad()
        fabric.print(f"epoch {epoch} last loss {loss.item():.4f}")

    if fabric.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in student.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
