"""Retrieval-style dual encoder trained with FSDP2 (fully_shard) on two spawned ranks.

In-batch contrastive loss with a learned temperature (CLIP style). Gradient accumulation
by hand: the reduce-scatter only runs on the last micro-batch of a window.
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

WORLD = 2
PORT = 49014
K = 4            # micro-batches per optimizer step
MICRO_BS = 8
STEPS = 16
DIM_IN, DIM_H, DIM_OUT = 40, 64, 32


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(DIM_IN, DIM_H)
        self.fc2 = nn.Linear(DIM_H, DIM_H)
        self.proj = nn.Linear(DIM_H, DIM_OUT, bias=False)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        h = h + F.gelu(self.fc2(h))
        return F.normalize(self.proj(h), dim=-1)


class DualEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = Tower()
        self.doc = Tower()


class ContrastiveTrainer:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(0)
        self.model = DualEncoder()
        for tower in (self.model.query, self.model.doc):
            fully_shard(tower)
        fully_shard(self.model)
        # CLIP-style learnable temperature, log(1/0.07)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=2e-3, weight_decay=0.01)
        self.temp_opt = torch.optim.SGD([self.logit_scale], lr=0.5)
        self.mix = torch.randn(DIM_IN, DIM_IN, generator=torch.Generator().manual_seed(5)) / DIM_IN ** 0.5

    def batch(self, step, micro):
        g = torch.Generator().manual_seed(10_000 + 101 * step + 11 * micro + 3 * self.rank)
        q = torch.randn(MICRO_BS, DIM_IN, generator=g)
        d = q @ self.mix + 0.3 * torch.randn(MICRO_BS, DIM_IN, generator=g)
        return q, d

    def loss_fn(self, q, d):
        zq, zd = self.model.query(q), self.model.doc(d)
        logits = self.logit_scale.exp().clamp(max=100) * zq @ zd.t()
        labels = torch.arange(q.size(0))
        return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))

    def train_step(self, step):
        for micro in range(K):
            self.model.set_requires_gradient_sync(micro == K - 1)
            q, d = self.batch(step, micro)
            loss = self.loss_fn(q, d) / K
            loss.backward()
        # the temperature lives outside the sharded model: average its gradient by hand
        dist.all_reduce(self.logit_scale.grad, op=dist.ReduceOp.AVG)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.temp_opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.temp_opt.zero_grad(set_to_none=True)
        return loss.item() * K

    def fit(self):
        for step in range(STEPS):
            loss = self.train_step(step)
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} loss {loss:.4f} scale {self.logit_scale.exp().item():.3f}", flush=True)

    def final_hash(self, dump):
        h = hashlib.sha256()
        full = {}
        for name, p in self.model.named_parameters():
            t = p.full_tensor().detach().float()
            full[name] = t
            h.update(t.contiguous().numpy().tobytes())
        if self.rank == 0:
            print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
            if dump:
                torch.save(full, dump)


def worker(rank, dump):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    trainer = ContrastiveTrainer(rank)
    trainer.fit()
    trainer.final_hash(dump)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    dump = sys.argv[1] if len(sys.argv) > 1 else None
    mp.spawn(worker, args=(dump,), nprocs=WORLD, join=True)
