# nanoGPT-flavoured DDP training of a tiny causal transformer on synthetic tokens.
# Launch: torchrun --nproc-per-node 2 c_b02.py
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# config (nanoGPT style globals)
vocab_size = 96
block_size = 24
n_layer = 2
n_head = 2
n_embd = 32
batch_size = 4                      # micro-batch per rank
gradient_accumulation_steps = 4     # micro-steps per optimizer step
max_iters = 20                      # optimizer steps
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 4
eval_every_micro = 6                # run a quick val pass every N micro-batches
eval_iters = 2
grad_clip = 1.0
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x, causal):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=causal, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, causal)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)

    g = torch.Generator().manual_seed(seed)
    train_data = torch.randint(0, vocab_size, (20000,), generator=g)
    val_data = torch.randint(0, vocab_size, (4000,), generator=g)
    data_gen = torch.Generator().manual_seed(seed + 1 + rank)
    val_gen = torch.Generator().manual_seed(seed + 101 + rank)

    def get_batch(split):
        data = train_data if split == "train" else val_data
        gen = data_gen if split == "train" else val_gen
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
        x = torch.stack([data[i:i + block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model = GPT()
    ddp_model = DDP(model)
    raw_model = ddp_model.module
    optimizer = torch.optim.AdamW(raw_model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)

    @torch.no_grad()
    def estimate_loss():
        raw_model.eval()
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch("val")
            _, loss = raw_model(X, Y)
            losses[k] = loss.item()
        raw_model.train()
        return losses.mean().item()

    def run_eval(micro_num):
        # free the gradient buffers before evaluating, like the memory notes recommend
        optimizer.zero_grad(set_to_none=True)
        val = estimate_loss()
        if rank == 0:
            print(f"micro {micro_num}: val loss {val:.4f}", flush=True)

    micro_num = 0
    X, Y = get_batch("train")
    for iter_num in range(max_iters):
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro_step in range(gradient_accumulation_steps):
            ddp_model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            _, loss = ddp_model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")
            loss.backward()
            micro_num += 1
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if micro_num % eval_every_micro < gradient_accumulation_steps:
            run_eval(micro_num)

    h = hashlib.sha256()
    for _, p in raw_model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
