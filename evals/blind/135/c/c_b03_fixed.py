"""nanoGPT-style training on a synthetic token stream: DDP via torchrun, gradient accumulation,
warm-up + cosine LR, gradient clipping."""
import hashlib
import math
import os
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
batch_size = 4
block_size = 32
vocab_size = 96
n_layer, n_head, n_embd = 2, 2, 48
gradient_accumulation_steps = 4
max_iters = 16
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 4
lr_decay_iters = 16
weight_decay = 0.1
grad_clip = 1.0
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for b in self.blocks:
            x = b(x, mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def maybe_no_sync(model, micro_step, accum_steps):
    # only all-reduce gradients on the last micro step of the window
    return nullcontext() if micro_step == accum_steps - 1 else model.no_sync()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)

    # this rank's shard of a synthetic token stream
    g = torch.Generator().manual_seed(seed + rank)
    data = torch.randint(0, vocab_size, (20000,), generator=g)

    def get_batch():
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=g)
        x = torch.stack([data[i:i + block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model = GPT()
    model = DDP(model)
    raw_model = model.module
    decay = [p for n, p in raw_model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in raw_model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate)

    X, Y = get_batch()
    for iter_num in range(max_iters):
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro_step in range(gradient_accumulation_steps):
            with maybe_no_sync(model, micro_step, gradient_accumulation_steps):
                loss = model(X, Y) / gradient_accumulation_steps
                X, Y = get_batch()  # prefetch the next batch
                loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and iter_num % 4 == 0:
            print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, lr {lr:.2e}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw_model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
