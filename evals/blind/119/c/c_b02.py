"""nanoGPT-style training on DDP (torchrun), synthetic tokens, tiny config."""
import hashlib
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# config (per-rank micro-batching, tuned on a single box)
batch_size = 4
block_size = 16
gradient_accumulation_steps = 2
max_iters = 12
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 2
lr_decay_iters = 12
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
n_layer, n_head, n_embd, vocab_size = 2, 2, 32, 64
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.ln_1(x)
        a, _ = self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)
        x = x + a
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
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


init_process_group(backend="gloo")
ddp_rank = int(os.environ["RANK"])
ddp_world_size = int(os.environ["WORLD_SIZE"])
master_process = ddp_rank == 0
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
assert gradient_accumulation_steps % ddp_world_size == 0
gradient_accumulation_steps //= ddp_world_size
if master_process:
    print(f"tokens per iteration will be: {tokens_per_iter:,}")

torch.manual_seed(seed)
data = torch.randint(0, vocab_size, (20000,), generator=torch.Generator().manual_seed(0))
data = (data + torch.arange(20000) % 7) % vocab_size  # a little structure to learn
batch_gen = torch.Generator().manual_seed(seed + ddp_rank)


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=batch_gen)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


model = GPT()
raw_model = model
model = DDP(model)
decay = [p for n, p in raw_model.named_parameters() if p.dim() >= 2]
no_decay = [p for n, p in raw_model.named_parameters() if p.dim() < 2]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=learning_rate, betas=(beta1, beta2))

X, Y = get_batch()
t0 = time.time()
for iter_num in range(max_iters):
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for micro_step in range(gradient_accumulation_steps):
        model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch()
        loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if master_process and iter_num % 4 == 0:
        print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, lr {lr:.2e}")

if master_process:
    print(f"done in {time.time() - t0:.1f}s")
    model = raw_model
    blob = b"".join(p.detach().float().cpu().contiguous().numpy().tobytes() for _, p in model.named_parameters())
    print("FINAL_SHA256", hashlib.sha256(blob).hexdigest())
destroy_process_group()
