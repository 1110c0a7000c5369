"""Knowledge distillation on 2 spawned ranks (gloo), replicas kept in lockstep by hand.

Teacher: frozen wide MLP. Student: small MLP trained with AdamW on
    alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(student, hard labels),
averaged over the K * W micro-batches of a window (all micro-batches have the same size).
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class DistillConfig:
    world_size: int = 2
    port: int = 43221
    grad_accum: int = 4
    updates: int = 12
    micro_bs: int = 12
    in_dim: int = 16
    n_classes: int = 5
    temperature: float = 2.0
    alpha: float = 0.7
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 2


def mlp(d_in, d_hidden, d_out, depth):
    layers, d = [], d_in
    for _ in range(depth):
        layers += [nn.Linear(d, d_hidden), nn.GELU()]
        d = d_hidden
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers)


def average_(params, attr, world_size):
    """All-reduce `p.<attr>` for every parameter and divide by the world size."""
    for p in params:
        t = getattr(p, attr)
        if t is None:
            continue
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t.div_(world_size)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def kd_loss(s_logits, t_logits, labels, cfg):
    T = cfg.temperature
    kl = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1), reduction="batchmean", log_target=True)
    ce = F.cross_entropy(s_logits, labels)
    return cfg.alpha * (T * T) * kl + (1.0 - cfg.alpha) * ce


def worker(rank, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.set_num_threads(1)

    torch.manual_seed(7)
    teacher = mlp(cfg.in_dim, 128, cfg.n_classes, depth=3).eval().requires_grad_(False)
    torch.manual_seed(11)
    student = mlp(cfg.in_dim, 32, cfg.n_classes, depth=2)

    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_lambda(step):
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        prog = (step - cfg.warmup) / max(1, cfg.updates - cfg.warmup)
        return 0.5 * (1.0 + math.cos(math.pi * prog))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    g = torch.Generator().manual_seed(100 + rank)

    for update in range(cfg.updates):
        opt.zero_grad(set_to_none=True)
        for _ in range(cfg.grad_accum):
            x = torch.randn(cfg.micro_bs, cfg.in_dim, generator=g)
            with torch.no_grad():
                t_logits = teacher(x)
            labels = t_logits.argmax(-1)
            loss = kd_loss(student(x), t_logits, labels, cfg)
            (loss / cfg.grad_accum).backward()
        opt.step()
        # keep the replicas identical
        average_(student.parameters(), "data", cfg.world_size)
        sched.step()

    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat([p.detach().float().flatten() for p in student.parameters()]), os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {params_sha256(student)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = DistillConfig()
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world_size, join=True)
