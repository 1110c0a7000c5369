"""nanoGPT-flavoured training loop on 2 DDP ranks (torchrun) over padded documents.

Micro-batches hold documents of different lengths, so token counts differ per
micro-batch and per rank. Each window's loss is a token sum over the number of
target tokens in the whole window on all ranks, multiplied by the world size to
undo DDP's average. The epoch has 11 micro-batches per rank with K = 4, so the
last window holds 3 micro-batches; its count covers exactly those. Weight tying,
two AdamW parameter groups and a cosine schedule over optimizer steps.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

vocab_size, block_size, n_embd, n_layer, n_head = 48, 24, 32, 2, 4
micro_batch_size, gradient_accumulation_steps, micro_batches = 4, 4, 11
learning_rate, min_lr, warmup_iters, grad_clip, weight_decay = 3e-3, 3e-4, 1, 1.0, 0.1
PAD = -100


class CausalBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, 2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([CausalBlock() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, vocab_size), targets.reshape(-1), ignore_index=PAD, reduction="sum")


def get_batches(rank):
    g = torch.Generator().manual_seed(123 + rank)
    out = []
    for _ in range(micro_batches):
        lens = torch.randint(4, block_size + 1, (micro_batch_size,), generator=g)
        x = torch.zeros(micro_batch_size, block_size, dtype=torch.long)
        y = torch.full((micro_batch_size, block_size), PAD, dtype=torch.long)
        for i, L in enumerate(lens.tolist()):
            doc = torch.randint(0, vocab_size, (L + 1,), generator=g)
            x[i, :L], y[i, :L] = doc[:-1], doc[1:]
        out.append((x, y))
    return out


def get_lr(it, max_iters):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1337)
    torch.use_deterministic_algorithms(True)
    raw = GPT()
    model = DDP(raw)
    decay = [p for n, p in raw.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in raw.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate, betas=(0.9, 0.95))

    batches = get_batches(rank)
    windows = [batches[i:i + gradient_accumulation_steps] for i in range(0, len(batches), gradient_accumulation_steps)]
    epochs = 2
    max_iters = epochs * len(windows)
    it = 0
    for epoch in range(epochs):
        for window in windows:
            lr = get_lr(it, max_iters)
            for group in optimizer.param_groups:
                group["lr"] = lr
            n_tok = torch.tensor([sum((y != PAD).sum().item() for _, y in window)], dtype=torch.float64)
            dist.all_reduce(n_tok)
            for micro_step, (x, y) in enumerate(window):
                model.require_backward_grad_sync = micro_step == len(window) - 1
                loss = model(x, y) * world / n_tok.item()
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            it += 1

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
