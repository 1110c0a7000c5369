"""Knowledge distillation with Lightning Fabric (DDP, 2 CPU ranks spawned by Fabric).
The teacher is frozen and never wrapped; the student has two optimizers (AdamW for the trunk,
SGD with momentum for the head); the two ranks feed micro-batches of different sizes, so the
loss is a sum over samples divided by the all-ranks window sample count, times the world size
(DDP averages over ranks).

python a_c02.py
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "34008")

CFG = dict(d_in=20, n_cls=6, accum=2, steps=10, bs_per_rank=(6, 3), temp=2.0, alpha=0.7,
           clip=1.0, seed=5)


def mlp(d_in, hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, d_out))


class Student(nn.Module):
    def __init__(self, d_in, n_cls):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, n_cls)

    def forward(self, x):
        return self.head(self.trunk(x))


def micro_batches(rank, bs, n, d_in, n_cls):
    g = torch.Generator().manual_seed(1000 + rank)
    for _ in range(n):
        x = torch.randn(bs, d_in, generator=g)
        y = torch.randint(0, n_cls, (bs,), generator=g)
        yield x, y


def distill_loss_sum(s_logits, t_logits, y, temp, alpha):
    kd = F.kl_div(F.log_softmax(s_logits / temp, -1), F.log_softmax(t_logits / temp, -1),
                  reduction="none", log_target=True).sum(-1) * temp ** 2
    ce = F.cross_entropy(s_logits, y, reduction="none")
    return (alpha * kd + (1 - alpha) * ce).sum()


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def run(fabric):
    c = CFG
    fabric.seed_everything(c["seed"])
    teacher = mlp(c["d_in"], 64, c["n_cls"]).requires_grad_(False).eval()
    student = Student(c["d_in"], c["n_cls"])
    opt_trunk = torch.optim.AdamW(student.trunk.parameters(), lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=0.05, momentum=0.9)
    student, opt_trunk, opt_head = fabric.setup(student, opt_trunk, opt_head)
    optimizers = (opt_trunk, opt_head)

    K, W = c["accum"], fabric.world_size
    bs = c["bs_per_rank"][fabric.global_rank]
    window_count = fabric.all_reduce(torch.tensor(float(bs * K)), reduce_op="sum")

    batches = micro_batches(fabric.global_rank, bs, c["steps"] * K, c["d_in"], c["n_cls"])
    for it, (x, y) in enumerate(batches):
        boundary = (it + 1) % K == 0
        with fabric.no_backward_sync(student, enabled=not boundary):
            with torch.no_grad():
                t_logits = teacher(x)
            s_logits = student(x)
            loss = distill_loss_sum(s_logits, t_logits, y, c["temp"], c["alpha"]) * W / window_count
            fabric.backward(loss)
        if boundary:
            torch.nn.utils.clip_grad_norm_(student.parameters(), c["clip"])
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)

    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha(student.module)}", flush=True)


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch(run)


if __name__ == "__main__":
    main()
