"""nanoGPT-style pretraining on spawned ranks with the optimizer fused into backward.

Each parameter gets its own AdamW, stepped from a post-accumulate-grad hook (the
"optimizer in backward" recipe) so that a gradient can be freed as soon as it is used.
Data parallelism is done by hand inside the same hook (all-reduce, average over ranks).
"""
import argparse
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
    block_size: int = 24
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 48


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
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# training config (nanoGPT style globals)
batch_size = 4
gradient_accumulation_steps = 4
max_iters = 12
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 3
lr_decay_iters = 12
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def get_batch(rank, it, micro_step, cfg):
    g = torch.Generator().manual_seed(1000 * it + 10 * micro_step + rank)
    data = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size + 1), generator=g)
    # a little structure so that the model has something to learn
    data[:, 1::2] = (data[:, 0:-1:2] * 7 + 3) % cfg.vocab_size
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


class FusedStepper:
    """One AdamW per parameter, run from the parameter's post-accumulate-grad hook."""

    def __init__(self, model, world_size):
        self.world_size = world_size
        self.optimizers = {}
        self.sync = False
        for name, p in model.named_parameters():
            wd = weight_decay if p.dim() >= 2 else 0.0
            self.optimizers[p] = torch.optim.AdamW([p], lr=learning_rate, betas=(beta1, beta2),
                                                   weight_decay=wd)
            p.register_post_accumulate_grad_hook(self._hook)

    def set_lr(self, lr):
        for opt in self.optimizers.values():
            for group in opt.param_groups:
                group["lr"] = lr

    def _hook(self, p):
        if not self.sync:
            return  # still accumulating: leave p.grad in place
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(self.world_size)
        self.optimizers[p].step()
        self.optimizers[p].zero_grad(set_to_none=True)


def worker(rank, world_size, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(1337)
    torch.use_deterministic_algorithms(True)
    cfg = GPTConfig()
    model = GPT(cfg)
    stepper = FusedStepper(model, world_size)

    for it in range(max_iters):
        stepper.set_lr(get_lr(it))
        for micro_step in range(gradient_accumulation_steps):
            stepper.sync = micro_step == gradient_accumulation_steps - 1
            X, Y = get_batch(rank, it, micro_step, cfg)
            loss = model(X, Y) / gradient_accumulation_steps
            loss.backward()
        if rank == 0 and it % 4 == 0:
            print(f"iter {it}: loss {loss.item() * gradient_accumulation_steps:.4f}", flush=True)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        dump = os.environ.get("PARAM_DUMP")
        if dump:
            torch.save(flat, dump)
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=38201)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    mp.spawn(worker, args=(args.world_size, args.port), nprocs=args.world_size, join=True)
