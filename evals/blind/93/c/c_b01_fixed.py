"""Fast adversarial training (FGSM, "free-AT" style) of a small conv classifier.

Two ranks are spawned by this script; gradients are summed by hand once per
window and divided by the world size (no DDP wrapper).  Each micro-batch trains
on the clean and the FGSM-perturbed input.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
ACCUM = 4           # micro-batches per optimizer step
UPDATES = 10
MICRO_BS = 8
EPS = 0.25
LR = 3e-3
PORT = 46202


class SmallCNN(nn.Module):
    def __init__(self, n_cls=5):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * 4 * 4, n_cls)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def shard(rank):
    g = torch.Generator().manual_seed(1234 + rank)
    n = UPDATES * ACCUM * MICRO_BS
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = (x[:, 0, :4].sum((1, 2)) > x[:, 0, 4:].sum((1, 2))).long() + 2 * (x[:, 0, :, :4].mean((1, 2)) > 0).long()
    y = torch.where(torch.rand(n, generator=g) < 0.1, torch.full_like(y, 4), y)
    return x.split(MICRO_BS), y.split(MICRO_BS)


def fgsm_perturb(model, x, y, eps):
    x = x.clone().requires_grad_(True)
    loss = F.cross_entropy(model(x), y)
    (grad_x,) = torch.autograd.grad(loss, x)  # input gradient only, parameters untouched
    delta = eps * grad_x.sign()
    return (x + delta).detach()


def average_gradients(model, world):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(world)
    off = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[off:off + n].view_as(g))
        off += n


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    xs, ys = shard(rank)

    mb = 0
    for update in range(UPDATES):
        for _ in range(ACCUM):
            x, y = xs[mb], ys[mb]
            mb += 1
            x_adv = fgsm_perturb(model, x, y, EPS)
            logits = model(torch.cat([x, x_adv]))
            loss = F.cross_entropy(logits, torch.cat([y, y]))
            (loss / ACCUM).backward()
        average_gradients(model, WORLD)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and update % 3 == 0:
            print(f"update {update} loss {loss.item():.4f}", flush=True)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.use_deterministic_algorithms(True)
    mp.spawn(worker, nprocs=WORLD, join=True)
