"""
nanoGPT-flavoured training of a tiny GPT on synthetic ragged documents, DDP on 2 ranks.

Each sequence is a document padded to block_size; padded positions carry target -1.
The loss of an optimizer step is the token mean over the whole window on all ranks:
the window (grad_accum micro-batches) is read ahead, its valid-token count all-reduced,
and every micro-batch contributes sum_nll * world / n_tokens_all (DDP divides by world).
The data run out on a short last window (3, 3, ..., 3, 2 micro-batches).
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
block_size = 24
vocab_size = 80
n_layer = 2
n_head = 2
n_embd = 32
batch_size = 6
gradient_accumulation_steps = 3
micro_batches_per_rank = 26  # 8 full windows + a window of 2
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 2
weight_decay = 0.1
grad_clip = 0.4
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        mask = torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), 1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        T = x.size(1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        # summed NLL over valid targets; normalisation is done by the caller
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1),
                               ignore_index=-1, reduction="sum")


def get_lr(it, max_iters):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def get_batch(gen):
    x = torch.randint(0, vocab_size, (batch_size, block_size), generator=gen)
    x = (x.cumsum(1) * 7) % vocab_size  # some learnable structure
    lengths = torch.randint(4, block_size + 1, (batch_size,), generator=gen)
    y = torch.roll(x, -1, 1)
    keep = torch.arange(block_size)[None, :] < (lengths[:, None] - 1)
    y = torch.where(keep, y, torch.full_like(y, -1))
    return x, y


dist.init_process_group(backend="gloo")
ddp_rank = int(os.environ["RANK"])
ddp_world_size = int(os.environ["WORLD_SIZE"])
master_process = ddp_rank == 0
torch.manual_seed(seed)
torch.use_deterministic_algorithms(True)
data_gen = torch.Generator().manual_seed(seed + ddp_rank)

raw_model = GPT()
model = DDP(raw_model)
params = [p for p in raw_model.parameters() if p.requires_grad]
decay = [p for p in params if p.dim() >= 2]
nodecay = [p for p in params if p.dim() < 2]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                               {"params": nodecay, "weight_decay": 0.0}],
                              lr=learning_rate, betas=(0.9, 0.95))

stream = [get_batch(data_gen) for _ in range(micro_batches_per_rank)]
max_iters = math.ceil(micro_batches_per_rank / gradient_accumulation_steps)

for iter_num in range(max_iters):
    lr = get_lr(iter_num, max_iters)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    window = stream[iter_num * gradient_accumulation_steps:(iter_num + 1) * gradient_accumulation_steps]
    n_tok = torch.tensor(float(sum((y != -1).sum().item() for _, y in window)))
    dist.all_reduce(n_tok, op=dist.ReduceOp.SUM)
    for micro_step, (X, Y) in enumerate(window):
        model.require_backward_grad_sync = (micro_step == len(window) - 1)
        loss = model(X, Y) * ddp_world_size / n_tok
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if master_process and iter_num % 3 == 0:
        print(f"iter {iter_num}: window {len(window)} lr {lr:.2e} grad_norm {norm:.3f}", flush=True)

sha = hashlib.sha256()
for name, p in raw_model.named_parameters():
    sha.update(p.detach().float().contiguous().numpy().tobytes())
if master_process:
    print(f"FINAL_SHA256 {sha.hexdigest()}")
dist.destroy_process_group()
