"""minGPT-style trainer on a synthetic character task, DDP on spawned ranks.

The trainer is split into hooks: the fit loop draws one window of micro-batches at a
time, runs them under no_sync except the last, and calls on_window_end() after each.
"""
import hashlib
import math
import os
from contextlib import nullcontext
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = SimpleNamespace(
    world_size=2, port=47205, vocab=32, block=16, n_embd=48, n_head=4, n_layer=2,
    batch_size=4, grad_accum=2, epochs=2, batches_per_epoch=24, lr=3e-3,
    warmup=3, grad_clip=1.0, weight_decay=0.1, seed=1337,
)
CFG.max_iters = CFG.epochs * CFG.batches_per_epoch // CFG.grad_accum


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(c.block, c.block, dtype=torch.bool), 1), persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:t, :t], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.n_embd)
        self.pos = nn.Parameter(torch.zeros(1, c.block, c.n_embd))
        self.blocks = nn.Sequential(*[Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.head = nn.Linear(c.n_embd, c.vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batch(c, gen):
    # a noisy affine recurrence the model can learn
    start = torch.randint(0, c.vocab, (c.batch_size, 1), generator=gen)
    steps = torch.arange(c.block + 1)[None]
    seq = (start * 5 + 3 * steps) % c.vocab
    flip = torch.rand(seq.shape, generator=gen) < 0.1
    seq = torch.where(flip, torch.randint(0, c.vocab, seq.shape, generator=gen), seq)
    return seq[:, :-1], seq[:, 1:]


class Trainer:
    def __init__(self, config, rank):
        self.config = config
        self.rank = rank
        torch.manual_seed(config.seed)
        self.raw_model = GPT(config)
        self.model = DDP(self.raw_model)
        decay = [p for n, p in self.raw_model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.raw_model.named_parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.lr, betas=(0.9, 0.95))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_lambda)
        self.iter_num = 0
        self.windows_seen = 0

    def lr_lambda(self, it):
        c = self.config
        if it < c.warmup:
            return (it + 1) / c.warmup
        ratio = (it - c.warmup) / max(1, c.max_iters - c.warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, ratio)))

    def windows(self, epoch):
        c = self.config
        window = []
        for b in range(c.batches_per_epoch):
            gen = torch.Generator().manual_seed(c.seed + 10_000 * epoch + 100 * b + self.rank)
            window.append(make_batch(c, gen))
            if len(window) == c.grad_accum:
                yield window
                window = []
        if window:
            yield window

    def training_step(self, batch):
        x, y = batch
        loss = self.model(x, y) / self.config.grad_accum
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1

    def on_window_end(self):
        self.windows_seen += 1
        if self.windows_seen % self.config.grad_accum == 0:
            self.optimizer_step()

    def fit(self):
        self.model.train()
        for epoch in range(self.config.epochs):
            for window in self.windows(epoch):
                for i, batch in enumerate(window):
                    ctx = self.model.no_sync() if i < len(window) - 1 else nullcontext()
                    with ctx:
                        self.training_step(batch)
                self.on_window_end()


def main(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(CFG.port)
    dist.init_process_group("gloo", rank=rank, world_size=CFG.world_size)
    torch.use_deterministic_algorithms(True)
    trainer = Trainer(CFG, rank)
    trainer.fit()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.raw_model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, nprocs=CFG.world_size, join=True)
