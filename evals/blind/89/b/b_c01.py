"""FSDP2 (fully_shard) token LM on two spawned CPU ranks.

* every block is its own FSDP unit, the root is sharded too;
* bf16 compute parameters with fp32 gradient reduction (MixedPrecisionPolicy);
* variable-length, right-padded sequences: the window's loss is the sum of
  token losses over the window's valid-token count on all ranks (times W,
  because FSDP averages gradients over ranks);
* each epoch has 10 micro-batches per rank, K = 4: windows 4, 4, 2;
* gradient clipping at 0.5 on the sharded gradients.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

WORLD = 2
PORT = 41107
K = 4
MICRO_BS = 4
SEQ = 12
VOCAB = 50
EPOCHS = 3
PAD = -100


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, h):
        return h + self.ff(self.norm(h))


class TinyLM(nn.Module):
    def __init__(self, d=32, n_layer=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(SEQ, d))
        self.blocks = nn.ModuleList(Block(d) for _ in range(n_layer))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def rank_batches(rank, epoch):
    """10 right-padded micro-batches for this rank and epoch."""
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    out = []
    for _ in range(10):
        idx = torch.randint(0, VOCAB, (MICRO_BS, SEQ), generator=g)
        lens = torch.randint(3, SEQ + 1, (MICRO_BS,), generator=g)
        tgt = torch.roll(idx, -1, dims=1)
        mask = torch.arange(SEQ)[None, :] < (lens[:, None] - 1)
        tgt = torch.where(mask, tgt, torch.full_like(tgt, PAD))
        out.append((idx, tgt))
    return out


def windows(batches, k):
    for s in range(0, len(batches), k):
        yield batches[s:s + k]


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (WORLD,))
    model = TinyLM()
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)

    for epoch in range(EPOCHS):
        for win in windows(rank_batches(rank, epoch), K):
            n_tok = torch.tensor(float(sum((t != PAD).sum().item() for _, t in win)))
            dist.all_reduce(n_tok)
            for j, (idx, tgt) in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                logits = model(idx).float()
                loss = F.cross_entropy(logits.view(-1, VOCAB), tgt.view(-1),
                                       ignore_index=PAD, reduction="sum")
                (loss * WORLD / n_tok).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()

    full = [(n, p.full_tensor().detach().float()) for n, p in model.named_parameters()]
    if rank == 0:
        h = hashlib.sha256()
        for _, t in full:
            h.update(t.contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
