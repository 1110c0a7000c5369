"""nanoGPT-style DDP pretraining on a synthetic token stream (torchrun, gloo, CPU).

Before the loop we time one forward/backward to report tokens/s and an MFU-ish
number, the way many forks of nanoGPT do.
"""
import hashlib
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# ---- config (nanoGPT style globals) ----
block_size = 16
vocab_size = 64
n_layer = 2
n_head = 2
n_embd = 32
batch_size = 4
gradient_accumulation_steps = 4
max_iters = 20
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 4
lr_decay_iters = 20
weight_decay = 0.1
grad_clip = 1.0
seed = 1337


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, wd, lr):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        nodecay = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": wd}, {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def make_stream(n=20000):
    g = torch.Generator().manual_seed(0)
    # a noisy "counting" language so the model has something to learn
    start = torch.randint(0, vocab_size, (n // 8,), generator=g)
    steps = torch.randint(1, 4, (n // 8,), generator=g)
    seq = (start[:, None] + steps[:, None] * torch.arange(8)) % vocab_size
    return seq.flatten()


def get_batch(data, gen):
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


def benchmark_step(model, X, Y):
    """One timed fwd/bwd to log throughput before training starts."""
    t0 = time.time()
    _, loss = model(X, Y)
    loss.backward()
    dt = time.time() - t0
    return X.numel() / max(dt, 1e-9)


def params_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    master_process = rank == 0
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + rank)
    data = make_stream()

    model = GPT()
    optimizer = model.configure_optimizers(weight_decay, learning_rate)
    model = DDP(model)
    raw_model = model.module

    X, Y = get_batch(data, gen)
    tok_per_s = benchmark_step(model, X, Y)
    if master_process:
        print(f"warm-up: {tok_per_s:.0f} tok/s per rank", flush=True)

    for iter_num in range(max_iters):
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro_step in range(gradient_accumulation_steps):
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch(data, gen)
            loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if master_process and iter_num % 5 == 0:
            print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}", flush=True)

    if master_process:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in raw_model.named_parameters()}, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", params_sha(raw_model), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
