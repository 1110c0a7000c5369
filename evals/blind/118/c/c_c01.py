"""Token-level distillation on 2 spawned DDP ranks.

Ragged sequences (padding masked out). Each window reads its micro-batches ahead,
counts the valid tokens on all ranks, and every micro-step's summed KD loss is
divided by that count and multiplied by the world size (DDP averages over ranks).
8 micro-batches per rank with K = 3 -> windows of 3, 3 and 2.
Student body on AdamW, output head on SGD; global norm clip at 0.17 (acts on the first windows).
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, DIM, T, B = 40, 32, 10, 4
K = 3
MICRO_PER_RANK = 8
EPOCHS = 2
TEMP = 2.0
CLIP = 0.17
PORT = 49231


class TokenNet(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.mix = nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.mix(h)
        return self.head(h)


def rank_data(rank):
    g = torch.Generator().manual_seed(500 + rank)
    batches = []
    for _ in range(MICRO_PER_RANK):
        ids = torch.randint(1, VOCAB, (B, T), generator=g)
        lens = torch.randint(2, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None, :] < lens[:, None]
        ids = ids.masked_fill(~mask, 0)
        batches.append((ids, mask))
    return batches


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(21)
    teacher = TokenNet(64)
    teacher.requires_grad_(False).eval()
    student = TokenNet(DIM)
    model = DDP(student)
    body = [p for n, p in student.named_parameters() if not n.startswith("head.")]
    opt_body = torch.optim.AdamW(body, lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=0.05, momentum=0.9)
    optimizers = (opt_body, opt_head)

    data = rank_data(rank)
    for epoch in range(EPOCHS):
        for start in range(0, len(data), K):
            window = data[start:start + K]
            n_local = torch.tensor(float(sum(int(m.sum()) for _, m in window)))
            dist.all_reduce(n_local, op=dist.ReduceOp.SUM)
            n_total = n_local.item()
            for i, (ids, mask) in enumerate(window):
                last = i == len(window) - 1
                ctx = contextlib.nullcontext() if last else model.no_sync()
                with ctx:
                    s_logits = model(ids)
                    with torch.no_grad():
                        t_logits = teacher(ids)
                    kl = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                                  log_target=True, reduction="none").sum(-1)
                    loss = (kl * mask).sum() * TEMP * TEMP / n_total * world
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), CLIP)
            for o in optimizers:
                o.step()
            for o in optimizers:
                o.zero_grad(set_to_none=True)

    if rank == 0:
        named = list(student.named_parameters())
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in named])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
