"""nanoGPT-style pretraining on a toy corpus, two ranks spawned from this file.

Global batch is given as a number of micro-batches per optimizer step over the whole job
(nanoGPT's `gradient_accumulation_steps`), split over the ranks at start-up.
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
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 61
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


@dataclass
class TrainConfig:
    batch_size: int = 4                       # per rank micro-batch
    gradient_accumulation_steps: int = 8      # over the whole job, divided by world size
    max_iters: int = 20
    learning_rate: float = 3e-3
    min_lr: float = 3e-4
    warmup_iters: int = 3
    decay_tokens: int = 20 * 8 * 4 * 16       # decay the LR over this many tokens
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1337
    port: int = 49212


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.n_head = cfg.n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        nodecay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95))


def main(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    tc, mc = TrainConfig(), GPTConfig()
    os.environ["MASTER_PORT"] = str(tc.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    master_process = rank == 0

    assert tc.gradient_accumulation_steps % world_size == 0
    gradient_accumulation_steps = tc.gradient_accumulation_steps // world_size
    tokens_per_iter = gradient_accumulation_steps * world_size * tc.batch_size * mc.block_size
    lr_decay_iters = tc.decay_tokens // tokens_per_iter
    if master_process:
        print(f"tokens per iteration will be: {tokens_per_iter:,}; decay over {lr_decay_iters} iters")

    torch.manual_seed(tc.seed)
    corpus = torch.randint(0, mc.vocab_size, (20000,), generator=torch.Generator().manual_seed(0))
    data_gen = torch.Generator().manual_seed(tc.seed + rank)

    def get_batch():
        ix = torch.randint(len(corpus) - mc.block_size - 1, (tc.batch_size,), generator=data_gen)
        x = torch.stack([corpus[i:i + mc.block_size] for i in ix])
        y = torch.stack([corpus[i + 1:i + 1 + mc.block_size] for i in ix])
        return x, y

    def get_lr(it):
        if it < tc.warmup_iters:
            return tc.learning_rate * (it + 1) / (tc.warmup_iters + 1)
        if it > lr_decay_iters:
            return tc.min_lr
        decay_ratio = (it - tc.warmup_iters) / (lr_decay_iters - tc.warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return tc.min_lr + coeff * (tc.learning_rate - tc.min_lr)

    raw_model = GPT(mc)
    optimizer = raw_model.configure_optimizers(tc.weight_decay, tc.learning_rate)
    model = DDP(raw_model)

    X, Y = get_batch()
    for iter_num in range(tc.max_iters):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        for micro_step in range(gradient_accumulation_steps):
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch()
            loss.backward()
        if tc.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if master_process and iter_num % 5 == 0:
            print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, lr {lr:.2e}")

    if master_process:
        h = hashlib.sha256()
        for _, p in raw_model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in raw_model.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2, join=True)
