"""DeiT-style soft distillation of a frozen teacher into a small student.

Structure follows the DeiT / BEiT engine: a ``train_one_epoch`` function, a
NativeScaler-like loss scaler that owns backward / clip / step, bf16 autocast,
``update_grad=(it + 1) % accum_iter == 0`` and DDP with ``no_sync`` on the
accumulating iterations.  Launch with torchrun.
"""
import argparse
import hashlib
import math
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse():
    p = argparse.ArgumentParser("distill")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accum-iter", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--iters-per-epoch", type=int, default=12)
    p.add_argument("--blr", type=float, default=1e-3)
    p.add_argument("--clip-grad", type=float, default=0.25)
    p.add_argument("--distill-alpha", type=float, default=0.7)
    p.add_argument("--distill-tau", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=3)
    return p.parse_args()


class NativeScalerWithGradNormCount:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=10_000)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        norm = None
        if clip_grad is not None:
            # gradients are still multiplied by the loss scale here, so clip at the scaled threshold
            parameters = list(parameters)
            norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad * self._scaler.get_scale())
            norm = norm / self._scaler.get_scale()
        if update_grad:
            self._scaler.unscale_(optimizer)
            self._scaler.step(optimizer)
            self._scaler.update()
        return norm

    def state_dict(self):
        return self._scaler.state_dict()


def make_mlp(dims):
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    return nn.Sequential(*layers[:-1])


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(64, 96), nn.LayerNorm(96), nn.GELU())
        self.blocks = make_mlp([96, 96, 96])
        self.head = nn.Linear(96, 10)

    def forward(self, x):
        h = self.stem(x)
        return self.head(h + self.blocks(h))


def synthetic_batch(gen, bs):
    x = torch.randn(bs, 64, generator=gen)
    y = (x[:, :10].argmax(1) + (x[:, 10] > 1).long()) % 10
    return x, y


def distill_loss(logits, teacher_logits, y, alpha, tau):
    base = F.cross_entropy(logits, y)
    kd = F.kl_div(F.log_softmax(logits / tau, -1), F.log_softmax(teacher_logits / tau, -1),
                  reduction="batchmean", log_target=True) * tau * tau
    return (1 - alpha) * base + alpha * kd


def train_one_epoch(model, teacher, optimizer, scaler, gen, epoch, args, lr_at):
    model.train()
    accum_iter = args.accum_iter
    optimizer.zero_grad(set_to_none=True)
    for it in range(args.iters_per_epoch):
        if it % accum_iter == 0:
            step = epoch * (args.iters_per_epoch // accum_iter) + it // accum_iter
            for g in optimizer.param_groups:
                g["lr"] = lr_at(step)
        x, y = synthetic_batch(gen, args.batch_size)
        with torch.no_grad():
            t_logits = teacher(x)
        update = (it + 1) % accum_iter == 0
        with (nullcontext() if update else model.no_sync()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
            loss = distill_loss(logits.float(), t_logits, y, args.distill_alpha, args.distill_tau)
            loss = loss / accum_iter
            grad_norm = scaler(loss, optimizer, clip_grad=args.clip_grad,
                               parameters=model.parameters(), update_grad=update)
        if update:
            optimizer.zero_grad(set_to_none=True)
            if dist.get_rank() == 0 and it == args.iters_per_epoch - 1:
                print(f"epoch {epoch} loss {loss.item() * accum_iter:.4f} grad_norm {float(grad_norm):.4f}",
                      flush=True)


def main():
    args = parse()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    teacher = make_mlp([64, 256, 256, 10]).eval().requires_grad_(False)
    student = Student()
    model = DDP(student)

    eff_batch = args.batch_size * args.accum_iter * world
    lr = args.blr * eff_batch / 32
    decay, no_decay = [], []
    for n, p in student.named_parameters():
        (no_decay if p.ndim == 1 else decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    total = args.epochs * (args.iters_per_epoch // args.accum_iter)
    lr_at = lambda s: lr * min(1.0, (s + 1) / 2) * (0.5 + 0.5 * math.cos(math.pi * s / total))
    scaler = NativeScalerWithGradNormCount()
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)

    for epoch in range(args.epochs):
        train_one_epoch(model, teacher, optimizer, scaler, gen, epoch, args, lr_at)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
