"""DDP trainer for a tiny causal LM on synthetic prompt/answer sequences.

One backward per accumulation window: the window's summed token loss is normalised by the
number of answer tokens in the whole window on all ranks (x world size, DDP averages).
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

IGNORE = -100


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--seq-len", type=int, default=24)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, seq_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.mix = nn.Conv1d(dim, dim, kernel_size=3, padding=2)  # causal via left crop
        self.ff = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(),
                                nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(t))
        h = h + self.mix(h.transpose(1, 2))[:, :, :t].transpose(1, 2)
        h = h + self.ff(h)
        return self.head(h)


def synthetic_batches(args, rank, world, n_micro):
    """Every rank draws the same global stream and keeps its own rows; prompts vary in length."""
    g = torch.Generator().manual_seed(args.seed + 100)
    out = []
    for _ in range(n_micro):
        ids = torch.randint(0, args.vocab, (args.micro_batch * world, args.seq_len), generator=g)
        prompt = torch.randint(3, args.seq_len - 2, (args.micro_batch * world,), generator=g)
        labels = ids.clone()
        labels[torch.arange(args.seq_len)[None, :] < prompt[:, None]] = IGNORE
        sl = slice(rank * args.micro_batch, (rank + 1) * args.micro_batch)
        out.append({"input_ids": ids[sl], "labels": labels[sl]})
    return out


class Trainer:
    def __init__(self, args):
        self.args = args
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = TinyLM(args.vocab, args.dim, args.seq_len)
        self.ddp = DDP(self.model)
        self.opt = torch.optim.AdamW(self.ddp.parameters(), lr=args.lr, weight_decay=0.0)
        self.data = synthetic_batches(args, self.rank, self.world, args.steps * args.accum)

    def windows(self):
        k = self.args.accum
        for s in range(0, len(self.data), k):
            yield self.data[s:s + k]

    def count_tokens(self, window):
        n = torch.stack([(b["labels"][:, 1:] != IGNORE).sum() for b in window]).sum().float()
        dist.all_reduce(n)
        return n

    def window_loss(self, window):
        n_tok = self.count_tokens(window)
        total = torch.zeros(())
        # the K forwards only build the graph; the single backward below does the sync
        for i, b in enumerate(window):
            sync = i == len(window) - 1  # DDP arms the reducer in the forward
            with (contextlib.nullcontext() if sync else self.ddp.no_sync()):
                logits = self.ddp(b["input_ids"])[:, :-1]
                total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                b["labels"][:, 1:].reshape(-1),
                                                ignore_index=IGNORE, reduction="sum")
        return total * self.world / n_tok

    def train(self):
        self.ddp.train()
        for step, window in enumerate(self.windows()):
            loss = self.window_loss(window)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if self.rank == 0 and step % 5 == 0:
                print(f"step {step} loss {loss.item() / self.world:.4f}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse_args()
    tr = Trainer(args)
    tr.train()
    d = tr.digest()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
