"""Masked next-token training on FSDP2 (nested units) with ragged micro-batches.

Each optimizer window is normalised by the number of valid (non-padding) target tokens
across all ranks and all micro-batches of that window; the epoch ends in a short window.
The gradient reduce-scatter is deferred to the last micro-batch of each window, and the
clip runs on the sharded DTensor gradients. Spawns its own two ranks.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WORLD = 2
PORT = 49108
VOCAB, D, CTX, PAD = 50, 32, 16, 0
ACCUM = 4
MICRO_PER_EPOCH = 11      # -> windows of 4, 4, 3
EPOCHS = 2
MAX_NORM = 0.8


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 3 * D), nn.SiLU(), nn.Linear(3 * D, D))

    def forward(self, h):
        return h + self.ff(self.ln(h))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D, padding_idx=PAD)
        self.layers = nn.ModuleList([Layer() for _ in range(3)])
        self.lm = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + torch.cumsum(h, 1) / torch.arange(1, ids.shape[1] + 1)[None, :, None]
        for l in self.layers:
            h = l(h)
        return self.lm(h)


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.detach()
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        h.update(t.float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def make_epoch(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + 17 * rank + 3)
    out = []
    for _ in range(MICRO_PER_EPOCH):
        bsz = int(torch.randint(2, 7, (1,), generator=g))
        ids = torch.randint(1, VOCAB, (bsz, CTX), generator=g)
        lens = torch.randint(4, CTX + 1, (bsz,), generator=g)
        ids[torch.arange(CTX)[None, :] >= lens[:, None]] = PAD
        out.append(ids)
    return out


def windows(seq, k):
    for s in range(0, len(seq), k):
        yield seq[s:s + k]


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = Stack()
    mesh = init_device_mesh("cpu", (WORLD,))
    for l in model.layers:
        fully_shard(l, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98))

    for epoch in range(EPOCHS):
        for win in windows(make_epoch(rank, epoch), ACCUM):
            n_valid = torch.tensor(sum(int((ids[:, 1:] != PAD).sum()) for ids in win), dtype=torch.float64)
            dist.all_reduce(n_valid)
            for j, ids in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                logits = model(ids[:, :-1])
                tok_sum = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1),
                                          ignore_index=PAD, reduction="sum")
                # FSDP2 averages over ranks, so scale by WORLD to get sum / global count
                (tok_sum * WORLD / n_valid.float()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            opt.zero_grad(set_to_none=True)

    sha = params_sha(model)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


def main():
    mp.spawn(worker, nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
