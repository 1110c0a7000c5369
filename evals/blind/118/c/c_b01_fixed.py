"""nanoGPT-style character model, DDP on 2 CPU ranks (spawned here), cosine LR by hand."""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# ---- config (nanoGPT style globals) ----
block_size = 16
vocab_size = 48
n_embd = 32
n_head = 2
n_layer = 2
batch_size = 4
gradient_accumulation_steps = 4
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 2
epochs = 1
n_samples = 192           # 192 / 2 ranks / 4 = 24 micro-batches per rank -> 6 iters
weight_decay = 0.1
grad_clip = 0.0
PORT = 49202


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

    def forward(self, idx, targets):
        T = idx.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


def get_lr(it, lr_decay_iters):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def make_data():
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, vocab_size, (n_samples, block_size + 1), generator=g)
    return TensorDataset(data[:, :-1].contiguous(), data[:, 1:].contiguous())


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT()
    model = DDP(model)
    raw = model.module
    decay = [p for n, p in raw.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in raw.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate, betas=(0.9, 0.95))

    ds = make_data()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=True)
    lr_decay_iters = epochs * len(loader) // gradient_accumulation_steps
    max_iters = lr_decay_iters

    iter_num = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        data_iter = iter(loader)
        n_iters = len(loader) // gradient_accumulation_steps
        for _ in range(n_iters):
            lr = get_lr(iter_num, lr_decay_iters)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for micro_step in range(gradient_accumulation_steps):
                X, Y = next(data_iter)
                model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
                loss = model(X, Y) / gradient_accumulation_steps
                loss.backward()
            if grad_clip != 0.0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
            if iter_num >= max_iters:
                break

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in raw.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in raw.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
