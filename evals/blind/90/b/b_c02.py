# FSDP2 on ranks spawned by this script (torch.multiprocessing), token-level loss
# over variable-length padded sequences. Each window's loss is normalised by the
# number of valid tokens in the whole window across all ranks (times the world
# size, since FSDP2 averages over ranks). Epoch of 11 micro-batches with K = 4, so
# the last window holds 3 micro-batches. Gradient sync on every micro-batch (the
# reduce-scattered shards accumulate), clip at 0.5 on the DTensor gradients.
import hashlib
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

WORLD, K, MICRO, N_MICRO, EPOCHS = 2, 4, 3, 11, 2
V, T, D = 32, 10, 32
PAD = -100


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.l1 = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.l2 = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.lm = nn.Linear(D, V)

    def forward(self, x):
        h = self.emb(x)
        h = h + self.l1(h)
        h = h + self.l2(h)
        return self.lm(h)


def make_data(rank):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randint(0, V, (N_MICRO * MICRO, T), generator=g)
    y = torch.roll(x, -1, dims=1)
    lens = torch.randint(2, T + 1, (N_MICRO * MICRO,), generator=g)
    mask = torch.arange(T)[None, :] < lens[:, None]
    y = torch.where(mask, y, torch.full_like(y, PAD))
    return x, y


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "42113"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = TinyLM()
    fully_shard(model.l1)
    fully_shard(model.l2)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    x, y = make_data(rank)

    for epoch in range(EPOCHS):
        for w0 in range(0, N_MICRO, K):
            idx = list(range(w0, min(w0 + K, N_MICRO)))
            ys = [y[i * MICRO:(i + 1) * MICRO] for i in idx]
            n_tok = torch.tensor(float(sum(int((t != PAD).sum()) for t in ys)))
            dist.all_reduce(n_tok)
            for i in idx:
                logits = model(x[i * MICRO:(i + 1) * MICRO])
                loss = nn.functional.cross_entropy(logits.reshape(-1, V), y[i * MICRO:(i + 1) * MICRO].reshape(-1),
                                                   ignore_index=PAD, reduction="sum")
                (loss * WORLD / n_tok).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()

    flat = torch.cat([p.full_tensor().detach().float().reshape(-1) for _, p in model.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
