"""A small token-level LM training script, the way people write them, for `accumguard invariance`.

Run as ``python token_lm.py --accum K --micro-batch MB`` or under torchrun (2 ranks, DDP with
``no_sync`` on every micro-step but the last). Sequences have random valid lengths (padding
labelled -100), so micro-batches hold different numbers of tokens.

``--normalise mean``: per-micro-batch token mean / K (the 2024 transformers bug, F5): the
update depends on K. ``--normalise sum``: summed token loss / the window's token count over
all micro-steps and ranks (times W, since DDP averages): the update does not depend on K.
``--zero-grad-each-micro`` adds the F3 bug (only the last micro-batch reaches the optimizer).
K and MB fall back to the environment (ACCUMGUARD_K, ACCUMGUARD_MICRO_BATCH) when not given.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

VOCAB, SEQ, IGNORE = 32, 8, -100


class TinyLM(torch.nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.drop = torch.nn.Dropout(dropout)
        self.out = torch.nn.Linear(16, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.tanh(self.emb(x))))


def make_data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    y = torch.roll(x, -1, dims=1)
    lengths = torch.randint(1, SEQ + 1, (n,), generator=g)
    y[torch.arange(SEQ)[None, :] >= lengths[:, None]] = IGNORE
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=int(os.environ.get("ACCUMGUARD_K", "1")))
    p.add_argument("--micro-batch", type=int,
                   default=int(os.environ.get("ACCUMGUARD_MICRO_BATCH", "8")))
    p.add_argument("--normalise", choices=("mean", "sum"), default="sum")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--zero-grad-each-micro", action="store_true",
                   help="the F3 bug: clear gradients before every micro-step's backward")
    args = p.parse_args()
    k, mb = args.accum, args.micro_batch

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    model: torch.nn.Module = TinyLM(args.dropout)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    data = make_data(args.steps * k * mb * world)
    sampler = DistributedSampler(data, shuffle=False) if distributed else None
    loader = iter(DataLoader(data, batch_size=mb, sampler=sampler, shuffle=False))
    for step in range(args.steps):
        window = [next(loader) for _ in range(k)]
        n_tokens = sum((y != IGNORE).sum() for _, y in window).float()
        if distributed:
            dist.all_reduce(n_tokens)
        for i, (x, y) in enumerate(window):
            sync = i == k - 1
            ctx = model.no_sync() if distributed and not sync else contextlib.nullcontext()
            if args.zero_grad_each_micro:
                model.zero_grad()
            with ctx:
                logits = model(x).reshape(-1, VOCAB)
                if args.normalise == "mean":
                    loss = F.cross_entropy(logits, y.reshape(-1), ignore_index=IGNORE) / k
                else:
                    loss = F.cross_entropy(logits, y.reshape(-1), ignore_index=IGNORE,
                                           reduction="sum") * world / n_tokens
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not distributed or dist.get_rank() == 0:
            print(f"step {step + 1} done (K={k}, micro-batch {mb})", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
