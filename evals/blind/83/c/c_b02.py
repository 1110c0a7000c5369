"""nanoGPT-style pretraining loop on synthetic tokens (DDP, torchrun, CPU/gloo).

Budgets are given in tokens (as in many nanoGPT forks) and converted to iterations.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# config
batch_size = 4
block_size = 16
gradient_accumulation_steps = 2 * 4  # global; divided by the world size below
vocab_size = 96
n_embd = 32
n_head = 2
learning_rate = 3e-3
min_lr = 3e-4
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
train_tokens = 12 * 1024   # total token budget
warmup_tokens = 2 * 1024
seed = 1337
# -----------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(2)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        nodecay = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(beta1, beta2))


dist.init_process_group("gloo")
ddp_rank = dist.get_rank()
ddp_world_size = dist.get_world_size()
master_process = ddp_rank == 0
torch.set_num_threads(1)
assert gradient_accumulation_steps % ddp_world_size == 0
gradient_accumulation_steps //= ddp_world_size
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size


def tokens_to_iters(n_tokens):
    return n_tokens // (batch_size * block_size)


max_iters = train_tokens // tokens_per_iter
warmup_iters = tokens_to_iters(warmup_tokens)
lr_decay_iters = tokens_to_iters(train_tokens)
if master_process:
    print(f"tokens per iteration {tokens_per_iter}, max_iters {max_iters}")

# synthetic "dataset": a fixed random token stream, each rank reads its own offsets
g = torch.Generator().manual_seed(seed)
data = torch.randint(0, vocab_size, (20000,), generator=g)
data = (data % 7) * (vocab_size // 7) + (torch.arange(20000) % 5)  # a little structure
batch_gen = torch.Generator().manual_seed(seed + 1 + ddp_rank)


def get_batch():
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=batch_gen)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


torch.manual_seed(seed)
model = GPT()
optimizer = model.configure_optimizers()
model = DDP(model)
raw_model = model.module

X, Y = get_batch()
for iter_num in range(max_iters):
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for micro_step in range(gradient_accumulation_steps):
        model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch()
        loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if master_process and iter_num % 5 == 0:
        print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, lr {lr:.2e}", flush=True)

if master_process:
    h = hashlib.sha256()
    for _, p in raw_model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    os.makedirs("/tmp/c83_params", exist_ok=True)
    torch.save({n: p.detach().clone() for n, p in raw_model.named_parameters()},
               f"/tmp/c83_params/{os.path.basename(__file__)[:-3]}.pt")
dist.destroy_process_group()
