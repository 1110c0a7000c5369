"""FitNets-style feature distillation on 2 DDP ranks (torchrun).

A frozen, wider teacher; a student trained on cross-entropy + a soft-label KL term +
a hint loss that matches a linear projection of the student's hidden features to
the teacher's. The student is wrapped in DDP and accumulates K micro-batches under
no_sync(); every micro-batch has the same size, so mean losses / K give the
window's mean.
"""
import contextlib
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
    in_dim: int = 24
    n_classes: int = 10
    student_hidden: int = 32
    teacher_hidden: int = 96
    micro_batch: int = 8
    accum_steps: int = 3
    steps: int = 10
    lr: float = 2e-3
    temperature: float = 2.0
    alpha_kd: float = 0.5
    beta_hint: float = 1.0
    seed: int = 0


class Teacher(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(c.in_dim, c.teacher_hidden), nn.ReLU(),
                                  nn.Linear(c.teacher_hidden, c.teacher_hidden), nn.ReLU())
        self.cls = nn.Linear(c.teacher_hidden, c.n_classes)

    def forward(self, x):
        h = self.body(x)
        return self.cls(h), h


class Student(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(c.in_dim, c.student_hidden), nn.ReLU(),
                                  nn.Linear(c.student_hidden, c.student_hidden), nn.ReLU())
        self.cls = nn.Linear(c.student_hidden, c.n_classes)

    def forward(self, x):
        h = self.body(x)
        return self.cls(h), h


def distill_loss(c, s_logits, s_hint, t_logits, t_feat, y):
    ce = F.cross_entropy(s_logits, y)
    kd = F.kl_div(F.log_softmax(s_logits / c.temperature, -1),
                  F.softmax(t_logits / c.temperature, -1),
                  reduction="batchmean") * c.temperature ** 2
    hint = F.mse_loss(s_hint, t_feat)
    return ce + c.alpha_kd * kd + c.beta_hint * hint


def batches(c, rank, world):
    g = torch.Generator().manual_seed(c.seed + 1)
    w_true = torch.randn(c.in_dim, c.n_classes, generator=g)
    step = 0
    while True:
        for r in range(world):
            x = torch.randn(c.micro_batch, c.in_dim, generator=g)
            y = (x @ w_true + 0.5 * torch.randn(c.micro_batch, c.n_classes, generator=g)).argmax(-1)
            if r == rank:
                mine = (x, y)
        yield mine
        step += 1


def main():
    c = DistillConfig()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    torch.manual_seed(c.seed)
    teacher = Teacher(c).eval().requires_grad_(False)
    student = Student(c)
    hint_adapter = nn.Linear(c.student_hidden, c.teacher_hidden)  # FitNets regressor
    ddp_student = DDP(student)

    optimizer = torch.optim.AdamW(
        [{"params": student.parameters()}, {"params": hint_adapter.parameters()}],
        lr=c.lr, weight_decay=0.01)

    data = batches(c, rank, world)
    for step in range(c.steps):
        for micro in range(c.accum_steps):
            x, y = next(data)
            last = micro == c.accum_steps - 1
            ctx = contextlib.nullcontext() if last else ddp_student.no_sync()
            with ctx:
                with torch.no_grad():
                    t_logits, t_feat = teacher(x)
                s_logits, s_feat = ddp_student(x)
                loss = distill_loss(c, s_logits, hint_adapter(s_feat), t_logits, t_feat, y)
                (loss / c.accum_steps).backward()
        for p in hint_adapter.parameters():  # outside DDP: average its gradient by hand
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        torch.nn.utils.clip_grad_norm_(
            list(student.parameters()) + list(hint_adapter.parameters()), 5.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and step % 3 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    if rank == 0:
        named = list(student.named_parameters()) + \
            [("hint_adapter." + n, p) for n, p in hint_adapter.named_parameters()]
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in named])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
