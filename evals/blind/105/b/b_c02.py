"""Token-level sequence tagger trained with FSDP2 on two spawned CPU ranks.
Nested fully_shard units, bf16 parameters with an fp32 gradient reduction, micro-batches
of uneven size and padding, an epoch of 11 micro-batches with K = 4 (windows 4-4-3), the
loss normalised by the window's valid-token count over all ranks, and a clip on DTensors."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

WORLD = 2
PORT = 49108
K = 4
MICRO_PER_EPOCH = 11
EPOCHS = 2
VOCAB, N_TAGS, D = 64, 6, 32
IGNORE = -100


class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.conv = nn.Conv1d(d, d, kernel_size=3, padding=1, groups=d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.norm(x)
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return x + self.ff(h)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Mixer(D) for _ in range(3)])
        self.cls = nn.Linear(D, N_TAGS)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.cls(x)


def make_epoch(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + 31 * rank + 5)
    out = []
    for _ in range(MICRO_PER_EPOCH):
        b = int(torch.randint(2, 7, (1,), generator=g))
        T = int(torch.randint(6, 17, (1,), generator=g))
        ids = torch.randint(0, VOCAB, (b, T), generator=g)
        tags = (ids * 7 + torch.roll(ids, 1, dims=1)) % N_TAGS
        lengths = torch.randint(2, T + 1, (b,), generator=g)
        pad = torch.arange(T)[None, :] >= lengths[:, None]
        tags = tags.masked_fill(pad, IGNORE)
        ids = ids.masked_fill(pad, 0)
        out.append((ids, tags))
    return out


def windows(micro_batches):
    for s in range(0, len(micro_batches), K):
        yield micro_batches[s:s + K]


def worker(rank):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = Tagger()
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)

    n_updates = 0
    for epoch in range(EPOCHS):
        for win in windows(make_epoch(rank, epoch)):
            count = torch.tensor(float(sum((t != IGNORE).sum() for _, t in win)))
            dist.all_reduce(count)  # valid tokens of this window on all ranks
            for j, (ids, tags) in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                logits = model(ids).float()
                loss_sum = F.cross_entropy(logits.reshape(-1, N_TAGS), tags.reshape(-1), ignore_index=IGNORE, reduction="sum")
                (loss_sum * WORLD / count).backward()  # FSDP2 averages over the ranks
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)
            n_updates += 1

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"updates {n_updates}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
