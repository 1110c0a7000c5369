"""Masked-token denoiser trained with FSDP2 on spawned ranks.

* one fully_shard unit per block, one for the embedding/head root
* MixedPrecisionPolicy: bf16 compute, fp32 gradient reduction
* CPUOffloadPolicy for parameters, gradients and optimizer state
* epochs of 8 micro-batches per rank, K = 3 -> windows of 3, 3 and 2
* each window normalised by its own all-ranks count of masked tokens
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

PORT = 49118
WORLD = 2
VOCAB, DIM, DEPTH, SEQ = 80, 48, 3, 20
MICRO_BS, PER_EPOCH, K, EPOCHS = 4, 8, 3, 3
MASK_ID = VOCAB - 1
MAX_NORM = 0.5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 3 * DIM), nn.GELU(), nn.Linear(3 * DIM, DIM))

    def forward(self, h):
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        return h + self.mlp(self.ln2(h))


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        h = self.emb(x) + self.pos
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def epoch_batches(rank, epoch):
    g = torch.Generator().manual_seed(991 + 31 * epoch + rank)
    out = []
    for _ in range(PER_EPOCH):
        clean = torch.randint(0, VOCAB - 1, (MICRO_BS, SEQ), generator=g)
        clean[:, 1::2] = (clean[:, 0::2] + 3) % (VOCAB - 1)
        rate = 0.1 + 0.4 * torch.rand(MICRO_BS, 1, generator=g)
        masked = torch.rand(MICRO_BS, SEQ, generator=g) < rate
        noisy = clean.masked_fill(masked, MASK_ID)
        target = clean.masked_fill(~masked, -100)
        out.append((noisy, target))
    return out


def windows(seq, k):
    for i in range(0, len(seq), k):
        yield seq[i:i + k]


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = Denoiser()
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=False)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp_policy, offload_policy=offload)
    fully_shard(model, mp_policy=mp_policy, offload_policy=offload)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)

    updates = 0
    for epoch in range(EPOCHS):
        for win in windows(epoch_batches(rank, epoch), K):
            n = torch.tensor(float(sum(int((t != -100).sum()) for _, t in win)))
            dist.all_reduce(n)
            for j, (x, t) in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                logits = model(x).float()
                loss = F.cross_entropy(logits.view(-1, VOCAB), t.view(-1),
                                       ignore_index=-100, reduction="sum")
                (loss * WORLD / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            opt.zero_grad()
            updates += 1

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(full.detach().float().contiguous().cpu().numpy().tobytes())
    if rank == 0:
        print(f"updates={updates}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD)
