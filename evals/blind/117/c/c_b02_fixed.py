"""Adversarially robust distillation (ARD-style), hand-written data parallelism.

Two ranks are spawned by this script (gloo, no DDP wrapper). Each micro-step crafts an
FGSM example against the student, then distils the frozen teacher on it. Gradients are
accumulated over K micro-steps and averaged over the ranks once per optimizer step.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

PORT = 49204


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eps", type=float, default=0.1)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.7)
    return p.parse_args()


def mlp(d_in, d_h, d_out, depth):
    layers, d = [], d_in
    for _ in range(depth):
        layers += [nn.Linear(d, d_h), nn.ReLU()]
        d = d_h
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers)


def kd_loss(s_logits, t_logits, T):
    return F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1),
                    reduction="batchmean") * T * T


def fgsm(student, teacher, x, eps, T):
    """One-step attack that maximises the student/teacher disagreement."""
    x_adv = x.clone().requires_grad_(True)
    loss_atk = kd_loss(student(x_adv), teacher(x_adv), T)
    (g_in,) = torch.autograd.grad(loss_atk, x_adv)   # leaves the parameters' .grad alone
    x_adv = (x + eps * g_in.sign()).detach()
    return x_adv


def shard(rank, world, args):
    g = torch.Generator().manual_seed(7)
    n = world * args.steps * args.grad_accum * args.micro_batch
    x = torch.randn(n, 32, generator=g)
    y = (x[:, :10] * torch.linspace(1, 2, 10)).argmax(-1)
    return x[rank::world], y[rank::world]


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    teacher = mlp(32, 128, 10, 3)
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher.eval()
    student = mlp(32, 48, 10, 2)
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.01)

    x_all, y_all = shard(rank, args.world_size, args)
    K, B = args.grad_accum, args.micro_batch
    it = 0
    for step in range(args.steps):
        for micro in range(K):
            x = x_all[it * B:(it + 1) * B]
            y = y_all[it * B:(it + 1) * B]
            it += 1
            x_adv = fgsm(student, teacher, x, args.eps, args.temperature)
            with torch.no_grad():
                t_adv = teacher(x_adv)
            loss = args.alpha * kd_loss(student(x_adv), t_adv, args.temperature) \
                + (1 - args.alpha) * F.cross_entropy(student(x), y)
            (loss / K).backward()
        for p in student.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(args.world_size)
        opt.step()
        opt.zero_grad(set_to_none=True)

    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(student)}", flush=True)
        torch.save(student.state_dict(),
                   os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                                os.path.basename(__file__).replace(".py", ".pt")))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    mp.spawn(worker, args=(get_args(),), nprocs=2, join=True)
