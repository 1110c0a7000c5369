"""Logit distillation of a small student MLP from a frozen teacher, nanoGPT-style loop.

torchrun, 2 ranks, DDP with `require_backward_grad_sync` on the window's last
micro-batch.  Settings come from argparse into a dataclass.
"""
import argparse
import dataclasses
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclasses.dataclass
class DistillConfig:
    in_dim: int = 24
    n_cls: int = 10
    micro_batch_size: int = 16
    grad_accum: int = 1
    epoch_micro_batches: int = 24
    lr: float = 1e-3
    warmup_iters: int = 2
    temperature: float = 2.0
    alpha: float = 0.7
    seed: int = 3


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batch-size", type=int, default=16)
    p.add_argument("--gradient-accumulation-steps", type=int, default=4)
    p.add_argument("--epoch-micro-batches", type=int, default=24)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--temperature", type=float, default=2.0)
    return p.parse_args()


def build_config(args):
    names = {f.name for f in dataclasses.fields(DistillConfig)}
    return DistillConfig(**{k: v for k, v in vars(args).items() if k in names})


def mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, o))


def get_lr(it, max_iters, cfg):
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    ratio = (it - cfg.warmup_iters) / max(1, max_iters - cfg.warmup_iters)
    return 0.1 * cfg.lr + 0.45 * cfg.lr * (1 + math.cos(math.pi * ratio))


def main():
    cfg = build_config(parse_args())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)

    torch.manual_seed(cfg.seed)
    teacher = mlp(cfg.in_dim, 128, cfg.n_cls).eval().requires_grad_(False)
    student = mlp(cfg.in_dim, 48, cfg.n_cls)
    model = DDP(student)
    optimizer = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.05)

    g = torch.Generator().manual_seed(500 + rank)
    n_micro = cfg.epoch_micro_batches
    X = torch.randn(n_micro, cfg.micro_batch_size, cfg.in_dim, generator=g)
    with torch.no_grad():
        Y = teacher(X.view(-1, cfg.in_dim)).argmax(-1).view(n_micro, -1)
    Y = torch.where(torch.rand(Y.shape, generator=g) < 0.15, torch.randint(0, cfg.n_cls, Y.shape, generator=g), Y)

    T, K = cfg.temperature, cfg.grad_accum
    max_iters = n_micro // K
    it = 0
    for micro in range(n_micro):
        x, y = X[micro], Y[micro]
        last_of_window = (micro + 1) % K == 0
        model.require_backward_grad_sync = last_of_window
        s_logits = model(x)
        with torch.no_grad():
            t_logits = teacher(x)
        kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1),
                      log_target=True, reduction="batchmean") * T * T
        ce = F.cross_entropy(s_logits, y)
        loss = (cfg.alpha * kd + (1 - cfg.alpha) * ce) / K
        loss.backward()
        if not last_of_window:
            continue
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it, max_iters, cfg)
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and it % 2 == 0:
            print(f"iter {it} loss {loss.item() * K:.4f}", flush=True)
        it += 1

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in student.named_parameters()])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
