"""Logit distillation on 2 spawned ranks without DDP, bf16 autocast, two optimizers.

* frozen teacher (random, fixed) and a frozen sinusoidal position table inside the student;
* backbone on AdamW, classifier head on SGD with momentum;
* a DataLoader with one worker process yields micro-batches of uneven size (3..9 samples);
* loss per window = sum over samples of (KD + CE) / number of samples in the window over all
  ranks; gradients are summed across ranks with one flat all-reduce per window (no / W);
* an EMA copy of the student is kept for evaluation (not part of the hashed parameters).
"""
import copy
import hashlib
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

FEAT, SEQ, NCLS = 16, 8, 6
K, STEPS, TAU, ALPHA = 3, 9, 2.0, 0.7


class MicroBatches(Dataset):
    """Item i is a whole micro-batch with its own size."""

    def __init__(self, rank, n):
        self.rank, self.n = rank, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(5000 + 131 * self.rank + i)
        bs = int(torch.randint(3, 10, (1,), generator=g))
        x = torch.randn(bs, SEQ, FEAT, generator=g)
        y = torch.randint(0, NCLS, (bs,), generator=g)
        return x, y


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        pos = torch.arange(SEQ)[:, None] / (10000 ** (torch.arange(FEAT)[None] / FEAT))
        self.pos = nn.Parameter(torch.where(torch.arange(FEAT) % 2 == 0, pos.sin(), pos.cos()),
                                requires_grad=False)
        self.backbone = nn.Sequential(nn.Linear(FEAT, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.head = nn.Linear(64, NCLS)

    def forward(self, x):
        return self.head(self.backbone(x + self.pos).mean(1))


class Teacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEAT, 96), nn.Tanh(), nn.Linear(96, NCLS))

    def forward(self, x):
        return self.net(x).mean(1)


def flat_allreduce(params):
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(11)
    teacher = Teacher().eval().requires_grad_(False)
    student = Student()
    ema = copy.deepcopy(student).requires_grad_(False)
    opt_body = torch.optim.AdamW(student.backbone.parameters(), lr=2e-3, weight_decay=0.05)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=5e-2, momentum=0.9)
    optimizers = [opt_body, opt_head]
    trainable = [p for p in student.parameters() if p.requires_grad]

    loader = DataLoader(MicroBatches(rank, K * STEPS), batch_size=None, shuffle=False,
                        num_workers=1, persistent_workers=False)
    it = iter(loader)
    for step in range(STEPS):
        window = [next(it) for _ in range(K)]
        n = torch.tensor(float(sum(y.numel() for _, y in window)))
        dist.all_reduce(n)
        for x, y in window:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                s_logits = student(x)
                with torch.no_grad():
                    t_logits = teacher(x)
            s_logits, t_logits = s_logits.float(), t_logits.float()
            kd = F.kl_div(F.log_softmax(s_logits / TAU, -1), F.log_softmax(t_logits / TAU, -1),
                          log_target=True, reduction="none").sum(-1) * TAU ** 2
            ce = F.cross_entropy(s_logits, y, reduction="none")
            loss = (ALPHA * kd + (1 - ALPHA) * ce).sum() / n
            loss.backward()
        flat_allreduce(trainable)
        for o in optimizers:
            o.step()
            o.zero_grad(set_to_none=True)
        with torch.no_grad():
            for pe, ps in zip(ema.parameters(), student.parameters()):
                pe.lerp_(ps, 0.1)
        if rank == 0 and step % 3 == 0:
            print(f"step {step} n={int(n)} loss(last micro) {loss.item():.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in student.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 49208
    mp.spawn(worker, args=(2, port), nprocs=2, join=True)
