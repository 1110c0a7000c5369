"""minGPT-style trainer class on 2 DDP ranks (torchrun), loop split over hooks.

- variable-length sequences padded with -100 targets; loss = sum of token NLL over the
  window / window's all-ranks token count (x world size, DDP averages)
- epoch of 10 micro-batches with K = 4: windows of 4, 4 and a short one of 2
- gradient sync only on the window's last micro-batch (no_sync spans forward + backward)
- clip at the boundary, LambdaLR warm-up per optimizer step, EMA copy of the weights
"""
import contextlib
import copy
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class GPTConfig:
    vocab_size = 40
    block_size = 16
    n_embd = 32
    n_head = 4
    n_layer = 2


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Parameter(torch.zeros(1, cfg.block_size, cfg.n_embd))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        mask = torch.triu(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool), 1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx):
        T = idx.size(1)
        x = self.tok(idx) + self.pos[:, :T]
        for b in self.blocks:
            x = b(x, self.mask[:T, :T])
        return self.head(self.ln_f(x))


class Trainer:
    def __init__(self, model, rank, world, grad_accum=4, epochs=2, micro_bs=4, lr=3e-3, warmup=2, clip=0.5):
        self.rank, self.world = rank, world
        self.grad_accum, self.epochs, self.micro_bs = grad_accum, epochs, micro_bs
        self.model = DDP(model)
        self.ema = copy.deepcopy(model).requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.05, betas=(0.9, 0.95))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warmup))
        self.clip = clip
        self.global_step = 0
        self._window_tokens = None

    # ---- data ---------------------------------------------------------------------
    def epoch_batches(self, epoch, n=10):
        g = torch.Generator().manual_seed(97 * epoch + self.rank)
        out = []
        for _ in range(n):
            T = GPTConfig.block_size
            x = torch.randint(0, GPTConfig.vocab_size, (self.micro_bs, T), generator=g)
            y = torch.roll(x, -1, 1)
            lens = torch.randint(4, T + 1, (self.micro_bs,), generator=g)
            y[torch.arange(T)[None, :] >= lens[:, None]] = -100
            out.append((x, y))
        return out

    # ---- hooks --------------------------------------------------------------------
    def on_window_start(self, window):
        n = torch.tensor(float(sum(int((y != -100).sum()) for _, y in window)))
        dist.all_reduce(n)
        self._window_tokens = n
        self.opt.zero_grad(set_to_none=True)

    def training_step(self, batch):
        x, y = batch
        logits = self.model(x)
        nll = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-100, reduction="sum")
        return nll * self.world / self._window_tokens

    def on_window_end(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.sched.step()
        self.global_step += 1
        with torch.no_grad():
            for pe, p in zip(self.ema.parameters(), self.model.module.parameters()):
                pe.lerp_(p, 0.1)

    # ---- loop ---------------------------------------------------------------------
    def fit(self):
        for epoch in range(self.epochs):
            batches = self.epoch_batches(epoch)
            for w0 in range(0, len(batches), self.grad_accum):
                window = batches[w0:w0 + self.grad_accum]
                self.on_window_start(window)
                for i, batch in enumerate(window):
                    sync = i == len(window) - 1
                    with (contextlib.nullcontext() if sync else self.model.no_sync()):
                        loss = self.training_step(batch)
                        loss.backward()
                self.on_window_end()


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    trainer = Trainer(GPT(GPTConfig()), rank, world)
    trainer.fit()
    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(trainer.model.module)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
