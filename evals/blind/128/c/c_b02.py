"""nanoGPT-style DDP training of a tiny char-level GPT on synthetic text.

torchrun --standalone-ish launch; gradient accumulation over K micro-batches,
DDP sync only on the last micro-step of each window.
"""
import hashlib
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

# -----------------------------------------------------------------------------
# config (nanoGPT-style globals)
vocab_size = 48
block_size = 16
n_layer = 2
n_head = 2
n_embd = 32
batch_size = 4
rows_per_rank = 22          # 6 micro-batches per epoch: 4,4,4,4,4,2
gradient_accumulation_steps = 3
epochs = 5
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 2
weight_decay = 0.1
grad_clip = 1.0
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        T = x.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def get_lr(it, max_iters):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def get_windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)

    # per-rank shard of a synthetic "text": a noisy modular sequence
    g = torch.Generator().manual_seed(seed + 17 * rank)
    start = torch.randint(0, vocab_size, (rows_per_rank, 1), generator=g)
    step = torch.randint(1, 5, (rows_per_rank, 1), generator=g)
    seq = (start + step * torch.arange(block_size + 1)) % vocab_size
    noise = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, vocab_size, seq.shape, generator=g), seq)
    ds = TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())
    loader = DataLoader(ds, batch_size=batch_size, shuffle=False, drop_last=False)

    model = GPT()
    raw_model = model
    model = DDP(model)
    decay = [p for n, p in raw_model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in raw_model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate, betas=(0.9, 0.95),
    )
    iters_per_epoch = math.ceil(len(loader) / gradient_accumulation_steps)
    max_iters = epochs * iters_per_epoch

    iter_num = 0
    for epoch in range(epochs):
        for window in get_windows(loader, gradient_accumulation_steps):
            lr = get_lr(iter_num, max_iters)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for micro_step, (X, Y) in enumerate(window):
                model.require_backward_grad_sync = micro_step == len(window) - 1
                logits, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps
                loss.backward()
            if grad_clip != 0.0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if rank == 0 and iter_num % 5 == 0:
                print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, lr {lr:.2e}")
            iter_num += 1

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw_model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
