"""Knowledge distillation (frozen teacher -> small student), spawned ranks, no DDP.

The training loop is written in the usual one-batch shape (zero_grad / backward / step);
gradient accumulation and the cross-rank average live in an optimizer wrapper that only
clears at the start of a window and only applies the update at its end. The last window
of an epoch may be short; `flush()` rescales it to a mean over the micro-batches it holds.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
PORT = 49208
ACCUM = 4
EPOCHS = 3
MICRO_PER_EPOCH = 10          # windows of 4, 4, 2 per epoch -> 9 updates
MICRO_BS = 8
IN_DIM, N_CLS = 20, 10
TEMP, ALPHA = 2.0, 0.7


class AccumulatingOptimizer:
    def __init__(self, optimizer, accum, world):
        self.optimizer = optimizer
        self.accum = accum
        self.world = world
        self.pending = 0
        self.updates = 0

    @property
    def params(self):
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def zero_grad(self):
        if self.pending == 0:
            self.optimizer.zero_grad(set_to_none=True)

    def step(self):
        self.pending += 1
        if self.pending == self.accum:
            self._apply(scale=1.0)

    def flush(self):
        if self.pending:
            self._apply(scale=self.accum / self.pending)

    def _apply(self, scale):
        params = [p for p in self.params if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat.mul_(scale / self.world)
        off = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[off:off + n].view_as(p.grad))
            off += n
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.pending = 0
        self.updates += 1


def make_models():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(IN_DIM, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, N_CLS))
    student = nn.Sequential(nn.Linear(IN_DIM, 32), nn.ReLU(), nn.Linear(32, N_CLS))
    teacher.requires_grad_(False).eval()
    return teacher, student


def kd_loss(s_logits, t_logits, labels):
    soft = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                    reduction="batchmean", log_target=True) * TEMP * TEMP
    hard = F.cross_entropy(s_logits, labels)
    return ALPHA * soft + (1 - ALPHA) * hard


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.use_deterministic_algorithms(True)

    teacher, student = make_models()
    opt = AccumulatingOptimizer(torch.optim.SGD(student.parameters(), lr=0.2, momentum=0.9), ACCUM, WORLD)

    g = torch.Generator().manual_seed(100 + rank)
    xs = torch.randn(MICRO_PER_EPOCH * MICRO_BS, IN_DIM, generator=g)
    ys = torch.randint(0, N_CLS, (xs.size(0),), generator=g)

    for epoch in range(EPOCHS):
        perm = torch.randperm(xs.size(0), generator=g)
        for i in range(MICRO_PER_EPOCH):
            idx = perm[i * MICRO_BS:(i + 1) * MICRO_BS]
            x, y = xs[idx], ys[idx]
            with torch.no_grad():
                t_logits = teacher(x)
            opt.zero_grad()
            loss = kd_loss(student(x), t_logits, y)
            (loss / ACCUM).backward()
            opt.step()
        opt.flush()
        if rank == 0:
            print(f"epoch {epoch} updates {opt.updates} last loss {loss.item():.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
