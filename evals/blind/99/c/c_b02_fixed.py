"""Masked-LM pretraining with a small hand-written Trainer (hooks in the style of
minGPT / composer), launched with torchrun, DDP over gloo.

Every sequence is scored by the mean cross-entropy over its masked positions and the
batch loss is the mean over sequences.  An epoch has 10 micro-batches per rank and
we accumulate 4, so each epoch ends in a 2-micro-batch window that is flushed by
``on_epoch_end`` (scaled by its real length).
"""
import argparse
import hashlib
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

VOCAB, MASK_ID, SEQ = 40, 1, 16


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class SyntheticCorpus(Dataset):
    """Sequences from a few random bigram chains so there is something to learn."""

    def __init__(self, n=80, seed=0):
        g = torch.Generator().manual_seed(seed)
        trans = torch.randint(2, VOCAB, (VOCAB,), generator=g)
        start = torch.randint(2, VOCAB, (n,), generator=g)
        seqs = [start]
        for _ in range(SEQ - 1):
            nxt = trans[seqs[-1]]
            noise = torch.rand(n, generator=g) < 0.2
            nxt = torch.where(noise, torch.randint(2, VOCAB, (n,), generator=g), nxt)
            seqs.append(nxt)
        self.x = torch.stack(seqs, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


class MaskCollator:
    def __init__(self, p=0.2, seed=0):
        self.p = p
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, batch):
        x = torch.stack(batch)
        m = torch.rand(x.shape, generator=self.g) < self.p
        m[:, 0] |= ~m.any(1)  # at least one masked position per sequence
        labels = torch.where(m, x, torch.full_like(x, -100))
        inp = torch.where(m, torch.full_like(x, MASK_ID), x)
        return inp, labels


class TinyBert(nn.Module):
    def __init__(self, d=48):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(SEQ, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 96, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.lm = nn.Linear(d, VOCAB)

    def forward(self, x):
        return self.lm(self.norm(self.enc(self.emb(x) + self.pos)))


def masked_seq_loss(logits, labels):
    ce = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    valid = (labels != -100).float()
    per_seq = (ce * valid).sum(1) / valid.sum(1)
    return per_seq.mean()


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        torch.manual_seed(args.seed)
        self.model = DDP(TinyBert())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01)
        ds = SyntheticCorpus(seed=args.seed)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=args.seed)
        self.loader = DataLoader(ds, batch_size=args.micro_batch_size, sampler=self.sampler,
                                 collate_fn=MaskCollator(seed=args.seed + self.rank))
        self.steps_per_epoch = math.ceil(len(self.loader) / args.grad_accum)
        total = self.steps_per_epoch * args.epochs
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * s / total)))
        self.global_step = 0
        self.micro_in_window = 0

    # ---- hooks -------------------------------------------------------------
    def on_epoch_start(self, epoch):
        self.sampler.set_epoch(epoch)
        self.micro_in_window = 0

    def window_len(self, batch_idx):
        n = len(self.loader)
        start = batch_idx - batch_idx % self.args.grad_accum
        return min(self.args.grad_accum, n - start)

    def training_step(self, batch, batch_idx):
        inp, labels = batch
        wlen = self.window_len(batch_idx)
        closes = self.micro_in_window + 1 == wlen
        ctx = nullcontext() if closes else self.model.no_sync()
        with ctx:
            loss = masked_seq_loss(self.model(inp), labels) / wlen
            loss.backward()
        self.micro_in_window += 1
        return loss.detach()

    def on_train_batch_end(self, batch_idx):
        if self.micro_in_window == self.args.grad_accum:
            self.optimizer_step()

    def optimizer_step(self):
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        self.micro_in_window = 0

    def on_epoch_end(self, epoch):
        if self.micro_in_window:  # flush the short tail window of the epoch
            self.optimizer.step()
            self.lr_scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.global_step += 1
            if self.rank == 0:
                print(f"epoch {epoch} flushed a {self.micro_in_window}-batch window, "
                      f"step {self.global_step}", flush=True)
            self.micro_in_window = 0

    # ---- loop --------------------------------------------------------------
    def fit(self):
        self.model.train()
        for epoch in range(self.args.epochs):
            self.on_epoch_start(epoch)
            for batch_idx, batch in enumerate(self.loader):
                self.training_step(batch, batch_idx)
                self.on_train_batch_end(batch_idx)
            self.on_epoch_end(epoch)

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    trainer = Trainer(args)
    trainer.fit()
    digest = trainer.final_digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
