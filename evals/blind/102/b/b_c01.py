"""FSDP2 trainer for a small sequence classifier with ragged micro-batches.

Each rank draws micro-batches of varying size.  The objective of a window is the
sum of per-example losses over every example the window sees on all ranks,
divided by that all-ranks count; FSDP2 averages over ranks, so each rank scales
its sum by world_size / global_count.  Gradient sync is deferred until the last
micro-batch of a window.  The trainer runs `optimizer.step()` after every
micro-batch: while sync is off the sharded parameters carry no gradient (it is
held unsharded inside FSDP), and `zero_grad(set_to_none=True)` keeps it that
way, so only the synced micro-batch moves the weights.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

VOCAB, DIM, SEQ, N_CLS = 40, 32, 10, 3
K = 4
BATCHES_PER_EPOCH = 10          # windows of 4, 4 and 2 micro-batches
EPOCHS = 2
MAX_NORM = 0.25
SEED = 99


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
             for _ in range(2)])

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return h


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.pool = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, N_CLS)

    def forward(self, x):
        return self.head(torch.tanh(self.pool(self.encoder(x).mean(1))))


def ragged_batches(rank, epoch):
    g = torch.Generator().manual_seed(SEED * 1000 + epoch * 10 + rank)
    out = []
    for _ in range(BATCHES_PER_EPOCH):
        n = int(torch.randint(2, 9, (1,), generator=g))
        x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        y = (x[:, 0] + x[:, 1] * 2) % N_CLS
        out.append((x, y))
    return out


def windows(batches, k):
    for s in range(0, len(batches), k):
        yield batches[s:s + k]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(SEED)
    model = Classifier()
    for layer in model.encoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model.encoder, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)

    for epoch in range(EPOCHS):
        for win in windows(ragged_batches(rank, epoch), K):
            count = torch.tensor(float(sum(len(y) for _, y in win)))
            dist.all_reduce(count)
            scale = world / count
            for j, (x, y) in enumerate(win):
                sync = j == len(win) - 1
                model.set_requires_gradient_sync(sync)
                loss = F.cross_entropy(model(x), y, reduction="sum") * scale
                loss.backward()
                if sync:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
                opt.step()
                opt.zero_grad(set_to_none=True)

    flat = []
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        flat.append(t.detach().float().reshape(-1))
    digest = hashlib.sha256(torch.cat(flat).numpy().tobytes()).hexdigest()
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
