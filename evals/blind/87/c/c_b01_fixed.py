"""nanoGPT-style pretraining on spawned ranks, data parallelism written by hand.

Two AdamW groups (decay for matrices, no decay for biases / norms / embeddings),
gradients averaged over the ranks once per window of K micro-batches.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 96
    block_size: int = 16
    n_embd: int = 32
    n_head: int = 4
    n_layer: int = 2


@dataclass
class TrainConfig:
    world_size: int = 2
    port: int = 39212
    seed: int = 1337
    batch_size: int = 4
    gradient_accumulation_steps: int = 4
    max_iters: int = 12
    learning_rate: float = 3e-3
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(c.block_size, c.block_size, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.ln_1(x)
        a, _ = self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)
        x = x + a
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=True)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        decay, no_decay = [], []
        for n, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (decay if p.dim() >= 2 and "wte" not in n and "wpe" not in n else no_decay).append(p)
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def get_batch(gen, tc, mc):
    data = torch.randint(0, mc.vocab_size, (tc.batch_size, mc.block_size + 1), generator=gen)
    return data[:, :-1], data[:, 1:]


def all_reduce_grads(optimizer, world_size):
    # average the accumulated gradients over the data-parallel ranks
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(world_size)


def run(rank, tc: TrainConfig):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(tc.port)
    dist.init_process_group("gloo", rank=rank, world_size=tc.world_size)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    mc = GPTConfig()
    torch.manual_seed(tc.seed)
    model = GPT(mc)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = model.configure_optimizers(tc.weight_decay, tc.learning_rate, tc.betas)
    gen = torch.Generator().manual_seed(tc.seed + 1000 * rank)

    K = tc.gradient_accumulation_steps
    for it in range(tc.max_iters):
        for micro_step in range(K):
            X, Y = get_batch(gen, tc, mc)
            loss = model(X, Y) / K
            loss.backward()
        all_reduce_grads(optimizer, tc.world_size)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and it % 4 == 0:
            print(f"iter {it}: loss {loss.item() * K:.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    tc = TrainConfig()
    mp.spawn(run, args=(tc,), nprocs=tc.world_size, join=True)
