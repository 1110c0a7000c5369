"""Masked-LM style token tagging with FSDP2 on ranks spawned by this script.

* nested units (each block, then the root), bf16 parameters with an fp32 reduce
* padded micro-batches: the loss is a token sum over the window's token count gathered
  from all ranks, times the world size (FSDP2 averages over ranks)
* 14 micro-batches per rank with K = 4: the last window is 2 micro-batches, normalised by
  its own count
* the global norm is clipped on the DTensor gradients (max 0.3, it acts)
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

PORT = 45108
WORLD, VOCAB, TAGS, D, T = 2, 50, 7, 32, 10
MICRO_BS, K, N_MICRO, SEED = 4, 4, 14, 3
IGNORE = -100


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D)) for _ in range(3)])
        self.head = nn.Linear(D, TAGS)

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


def micro_batches(rank):
    g = torch.Generator().manual_seed(SEED + 101 * rank)
    out = []
    for _ in range(N_MICRO):
        x = torch.randint(0, VOCAB, (MICRO_BS, T), generator=g)
        y = (x * 3 + 1) % TAGS
        lengths = torch.randint(2, T + 1, (MICRO_BS,), generator=g)
        pad = torch.arange(T)[None, :] >= lengths[:, None]
        y[pad] = IGNORE
        out.append((x, y))
    return out


def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(SEED)
    model = Tagger()
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for b in model.blocks:
        fully_shard(b, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    data = micro_batches(rank)
    windows = [data[i:i + K] for i in range(0, len(data), K)]
    for window in windows:
        count = torch.tensor(float(sum((y != IGNORE).sum().item() for _, y in window)))
        dist.all_reduce(count)
        for j, (x, y) in enumerate(window):
            model.set_requires_gradient_sync(j == len(window) - 1)
            logits = model(x).float()
            loss = nn.functional.cross_entropy(logits.reshape(-1, TAGS), y.reshape(-1),
                                               ignore_index=IGNORE, reduction="sum")
            (loss * WORLD / count).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.3)
        opt.step()
        opt.zero_grad()

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
