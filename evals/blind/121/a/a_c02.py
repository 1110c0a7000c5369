"""Padded-sequence LM on FSDP2 with bf16 compute and fp32 gradient reduction.

Each rank reads a whole window ahead (windows of 3, 3 and 2 micro-batches per
epoch), counts the window's real target tokens over all ranks, and sums token
losses scaled by W / count (FSDP2 averages over the W ranks).  Clip at 0.5.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

VOCAB, CTX, DIM, PAD = 61, 14, 48, -100
MICRO, WINDOWS = 3, (3, 3, 2)
EPOCHS, LR, CLIP = 2, 3e-3, 0.5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.mix = nn.Linear(CTX, CTX, bias=False)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, h):
        causal = torch.tril(torch.ones(CTX, CTX, dtype=h.dtype))
        h = h + torch.einsum("ts,bsd->btd", self.mix.weight * causal, self.ln(h))
        return h + self.mlp(self.ln(h))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.lm_head = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        h = self.tok(x)
        for b in self.blocks:
            h = b(h)
        return self.lm_head(h)


def make_epoch(rank, epoch):
    g = torch.Generator().manual_seed(500 + 31 * rank + epoch)
    n = sum(WINDOWS) * MICRO
    seq = torch.randint(1, VOCAB, (n, CTX + 1), generator=g)
    seq[:, 1:] = (seq[:, :-1] * 5 + 2) % VOCAB
    lengths = torch.randint(3, CTX + 1, (n,), generator=g)
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    for i, L in enumerate(lengths.tolist()):
        x[i, L:] = 0
        y[i, L:] = PAD
    return [(x[i:i + MICRO], y[i:i + MICRO]) for i in range(0, n, MICRO)]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(3)
    model = LM()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for b in model.blocks:
        fully_shard(b, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)

    steps = 0
    for epoch in range(EPOCHS):
        batches = iter(make_epoch(rank, epoch))
        for wlen in WINDOWS:
            window = [next(batches) for _ in range(wlen)]
            count = torch.tensor(float(sum((y != PAD).sum() for _, y in window)))
            dist.all_reduce(count)
            for j, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(j == wlen - 1)
                logits = model(x).float()
                tok_loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                           ignore_index=PAD, reduction="sum")
                (tok_loss * world / count).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad()
            steps += 1

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"steps {steps}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
