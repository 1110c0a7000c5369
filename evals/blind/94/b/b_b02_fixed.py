"""DDP token tagger, gradient accumulation with no_sync, loss over the window's label count.

torchrun --nproc-per-node 2 b_b02.py
"""
import argparse
import contextlib
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

IGNORE = -100


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--vocab", type=int, default=48)
    p.add_argument("--seq-len", type=int, default=12)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    return p.parse_args()


class Tagger(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mix = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        h = self.norm(h + self.mix(h))
        return self.out(h)


def make_shard(args, rank, n_micro):
    g = torch.Generator().manual_seed(args.seed * 100 + rank)
    batches = []
    for _ in range(n_micro):
        ids = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len), generator=g)
        labels = (ids * 3 + 1) % args.vocab
        keep = torch.randint(2, args.seq_len + 1, (args.micro_batch, 1), generator=g)
        pos = torch.arange(args.seq_len).unsqueeze(0)
        labels = labels.masked_fill(pos >= keep, IGNORE)
        batches.append((ids, labels))
    return batches


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = DDP(Tagger(args.vocab, args.dim))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.0)
        n_micro = args.steps_per_epoch * args.accum
        self.data = make_shard(args, self.rank, n_micro)
        self.micro_count = 0

    def window_count(self, window):
        n = torch.tensor(float(sum(int((lab != IGNORE).sum()) for _, lab in window)))
        dist.all_reduce(n)
        return n

    def micro_step(self, ids, labels, denom):
        self.micro_count += 1
        sync = self.micro_count % self.args.accum == 0
        ctx = contextlib.nullcontext() if sync else self.model.no_sync()
        with ctx:
            logits = self.model(ids)
            s = F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                ignore_index=IGNORE, reduction="sum")
            (s * self.world / denom).backward()
        return s.detach()

    def train(self):
        K = self.args.accum
        for epoch in range(self.args.epochs):
            for step in range(self.args.steps_per_epoch):
                window = self.data[step * K:(step + 1) * K]
                denom = self.window_count(window)
                for ids, labels in window:
                    self.micro_step(ids, labels, denom)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)

    def fingerprint(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    tr = Trainer(args)
    tr.train()
    digest = tr.fingerprint()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {digest}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
