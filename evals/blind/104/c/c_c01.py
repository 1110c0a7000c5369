"""nanoGPT-style char LM, DDP on 2 ranks, bf16 autocast, masked padding, EMA.

Epochs hold 10 micro-batches per rank and grad_accum is 4, so each epoch ends in a short
window of 2 micro-batches. Every window's loss is the sum over its valid tokens divided by the
valid-token count of the whole window on all ranks (times world size, since DDP averages).
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# -------------------------------------------------------------------- config (nanoGPT style)
block_size = 16
vocab_size = 40
n_layer = 2
n_head = 2
n_embd = 32
batch_size = 4
gradient_accumulation_steps = 4
learning_rate = 2e-3
weight_decay = 0.1
grad_clip = 0.5
ema_decay = 0.9
epochs = 3
seed = 1337
PAD = 0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        T = x.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
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
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x)).float()
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1), ignore_index=PAD, reduction="sum")


def build_data(world):
    g = torch.Generator().manual_seed(seed + 5)
    n = 10 * batch_size * world
    x = torch.randint(1, vocab_size, (n, block_size + 1), generator=g)
    lens = torch.randint(3, block_size + 1, (n,), generator=g)
    for i in range(n):
        x[i, lens[i] + 1:] = PAD
    return TensorDataset(x[:, :-1].contiguous(), x[:, 1:].contiguous())


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    raw = GPT()
    model = DDP(raw)
    ema = {k: v.detach().clone() for k, v in raw.state_dict().items()}
    decay, no_decay = [], []
    for n_, p in raw.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=(0.9, 0.95))
    ds = build_data(world)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=False)
    iter_num = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for w0 in range(0, len(batches), gradient_accumulation_steps):
            window = batches[w0:w0 + gradient_accumulation_steps]
            n_tok = torch.tensor(float(sum(int((y != PAD).sum()) for _, y in window)))
            dist.all_reduce(n_tok)
            for micro_step, (X, Y) in enumerate(window):
                model.require_backward_grad_sync = micro_step == len(window) - 1
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(X, Y) * world / n_tok
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for k, v in raw.state_dict().items():
                    ema[k].mul_(ema_decay).add_(v.detach(), alpha=1 - ema_decay)
            iter_num += 1
            if rank == 0 and iter_num % 3 == 0:
                print(f"iter {iter_num} epoch {epoch} window {len(window)} loss/tok {loss.item() / world:.4f}", flush=True)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
