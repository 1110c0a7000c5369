"""Sequence tagger on ragged synthetic sentences, DDP with a custom comm hook.

Token losses are summed on each rank; the comm hook turns the summed gradient into the
per-token mean of the window (fairseq-style "sample size" normalisation done at the
all-reduce instead of in the loss).  Micro-batches of a window are accumulated under
no_sync(); the hook fires once, on the window's last backward.
"""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, TAGS, DIM = 120, 9, 40
MICRO_BS, ACCUM, UPDATES = 6, 3, 10
PAD = 0


class HookState:
    """Shared between the training loop and the comm hook."""

    def __init__(self, process_group):
        self.process_group = process_group
        self.sample_size = 1.0


def sum_and_normalise_hook(state: HookState, bucket):
    buf = bucket.buffer()
    buf.div_(state.sample_size)
    fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.conv1 = nn.Conv1d(DIM, DIM, 3, padding=1)
        self.conv2 = nn.Conv1d(DIM, DIM, 5, padding=2)
        self.out = nn.Linear(DIM, TAGS)

    def forward(self, tokens):
        h = self.emb(tokens).transpose(1, 2)
        h = h + F.gelu(self.conv1(h))
        h = h + F.gelu(self.conv2(h))
        return self.out(h.transpose(1, 2))


def ragged_batches(rank, n):
    g = torch.Generator().manual_seed(4242 + rank)
    # rank 1 sees much longer sentences than rank 0
    lo, hi = (3, 9) if rank == 0 else (8, 22)
    for _ in range(n):
        lens = torch.randint(lo, hi, (MICRO_BS,), generator=g)
        T = int(lens.max())
        toks = torch.randint(1, VOCAB, (MICRO_BS, T), generator=g)
        pos = torch.arange(T).expand(MICRO_BS, T)
        valid = pos < lens[:, None]
        toks = toks.masked_fill(~valid, PAD)
        tags = (toks * 7 + torch.roll(toks, 1, dims=1)) % TAGS
        tags = tags.masked_fill(~valid, -100)
        yield toks, tags


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(7)
    model = DDP(Tagger())
    state = HookState(dist.group.WORLD)
    model.register_comm_hook(state, sum_and_normalise_hook)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    stream = ragged_batches(rank, UPDATES * ACCUM)
    for update in range(UPDATES):
        window = [next(stream) for _ in range(ACCUM)]
        n_tokens = sum(int((tags != -100).sum()) for _, tags in window)
        state.sample_size = float(n_tokens * world)
        for k, (toks, tags) in enumerate(window):
            last = k == ACCUM - 1
            with (nullcontext() if last else model.no_sync()):
                logits = model(toks)
                loss = F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1),
                                       ignore_index=-100, reduction="sum")
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
