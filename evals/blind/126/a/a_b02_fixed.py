"""Token tagging (NER-style) with class-balanced cross-entropy on FSDP2.

Rare tags get a larger weight in the loss.  Sequences have ragged lengths, so
micro-batches carry different numbers of labelled tokens.  Two ranks via
torchrun, CPU/gloo, synthetic data.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

TAG_FREQ = torch.tensor([0.70, 0.12, 0.08, 0.06, 0.04])


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=24)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Tagger(nn.Module):
    def __init__(self, args, n_tags):
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.dim, padding_idx=0)
        self.blocks = nn.ModuleList([Block(args.dim) for _ in range(args.layers)])
        self.head = nn.Linear(args.dim, n_tags)

    def forward(self, ids):
        h = self.embed(ids)
        for blk in self.blocks:
            h = blk(h)
        return self.head(h)


def make_batches(args, rank, n):
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    batches = []
    for _ in range(n):
        lens = torch.randint(3, args.seq_len + 1, (args.micro_bs,), generator=g)
        ids = torch.randint(1, args.vocab, (args.micro_bs, args.seq_len), generator=g)
        tags = torch.multinomial(TAG_FREQ, args.micro_bs * args.seq_len, replacement=True, generator=g)
        tags = tags.view(args.micro_bs, args.seq_len)
        tags = torch.where(ids % 7 == 0, torch.full_like(tags, 3), tags)
        pad = torch.arange(args.seq_len)[None, :] >= lens[:, None]
        ids[pad] = 0
        tags[pad] = -100
        batches.append((ids, tags))
    return batches


class TaggerTrainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = Tagger(args, len(TAG_FREQ))
        for blk in self.model.blocks:
            fully_shard(blk)
        fully_shard(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.0)
        class_weights = (1.0 / TAG_FREQ) / (1.0 / TAG_FREQ).sum() * len(TAG_FREQ)
        self.class_weights = class_weights
        self.criterion = nn.CrossEntropyLoss(weight=class_weights, ignore_index=-100, reduction="sum")
        self.batches = make_batches(args, self.rank, args.steps * args.grad_accum)

    def windows(self):
        K = self.args.grad_accum
        for s in range(0, len(self.batches), K):
            yield self.batches[s:s + K]

    def train_window(self, window):
        weight_total = sum(self.class_weights[tags[tags != -100]].sum() for _, tags in window)
        dist.all_reduce(weight_total, op=dist.ReduceOp.SUM)
        for j, (ids, tags) in enumerate(window):
            self.model.set_requires_gradient_sync(j == len(window) - 1)
            logits = self.model(ids)
            loss = self.criterion(logits.view(-1, logits.size(-1)), tags.view(-1)) * self.world / weight_total
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def fit(self):
        self.model.train()
        for step, window in enumerate(self.windows()):
            last = self.train_window(window)
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} loss {last:.4f}")

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(full.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    trainer = TaggerTrainer(args)
    trainer.fit()
    digest = trainer.digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {digest}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
