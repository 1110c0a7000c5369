"""nanoGPT-style logit distillation on DDP: a frozen teacher GPT, a smaller student.

Loop in the nanoGPT spirit, but wrapped in a small trainer class; micro-batches
stream from a per-rank generator, an optimizer step every K micro-batches.
"""
import hashlib
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
vocab_size = 64
block_size = 16
batch_size = 4
gradient_accumulation_steps = 4
max_iters = 12            # optimizer steps
eval_interval = 6         # in micro-batches (cheap held-out KL probe)
learning_rate = 3e-3
temperature = 2.0
alpha = 0.5
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_embd, n_head):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((block_size, block_size), float("-inf")), 1))

    def forward(self, idx):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.h:
            x = blk(x, self.mask[:t, :t])
        return self.lm_head(self.ln_f(x))


def get_batch(gen):
    data = torch.randint(0, vocab_size, (batch_size, block_size + 1), generator=gen)
    data[:, 1::2] = (data[:, 0:-1:2] * 7 + 3) % vocab_size  # learnable structure
    return data[:, :-1], data[:, 1:]


def distill_loss(s_logits, t_logits, targets):
    kd = F.kl_div(
        F.log_softmax(s_logits / temperature, -1),
        F.log_softmax(t_logits / temperature, -1),
        log_target=True,
        reduction="batchmean",
    ) * temperature**2 / s_logits.size(1)
    ce = F.cross_entropy(s_logits.reshape(-1, vocab_size), targets.reshape(-1))
    return alpha * kd + (1 - alpha) * ce


class DistillTrainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(seed + 1)
        self.teacher = GPT(n_layer=3, n_embd=64, n_head=4).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        torch.manual_seed(seed)
        self.raw_model = GPT(n_layer=2, n_embd=32, n_head=2)
        self.model = DDP(self.raw_model)
        self.optimizer = torch.optim.AdamW(self.raw_model.parameters(), lr=learning_rate, weight_decay=0.1)
        self.train_gen = torch.Generator().manual_seed(seed + 10 + rank)
        eval_gen = torch.Generator().manual_seed(seed + 999)
        self.eval_batches = [get_batch(eval_gen) for _ in range(2)]
        self.micro_step = 0
        self.iter_num = 0

    @torch.no_grad()
    def estimate_loss(self):
        self.raw_model.eval()
        losses = []
        for x, y in self.eval_batches:
            losses.append(distill_loss(self.raw_model(x), self.teacher(x), y).item())
        self.raw_model.train()
        return sum(losses) / len(losses)

    def micro(self, x, y):
        sync = (self.micro_step + 1) % gradient_accumulation_steps == 0
        self.model.require_backward_grad_sync = sync
        with torch.no_grad():
            t_logits = self.teacher(x)
        loss = distill_loss(self.model(x), t_logits, y) / gradient_accumulation_steps
        loss.backward()
        self.micro_step += 1
        if self.micro_step % eval_interval == 0:
            val = self.estimate_loss()
            if self.rank == 0:
                print(f"micro {self.micro_step}: val kd+ce {val:.4f}")
        return sync

    def step(self):
        torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1

    def train(self):
        while self.iter_num < max_iters:
            x, y = get_batch(self.train_gen)
            if self.micro(x, y):
                self.step()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer = DistillTrainer(rank, world)
    trainer.train()
    h = hashlib.sha256()
    for _, p in trainer.raw_model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
