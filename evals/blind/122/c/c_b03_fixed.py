# nanoGPT-style SFT on DDP: prompt tokens are masked out of the loss, so each
# optimizer step is normalised by the number of supervised tokens in the window
# across all ranks (sum of token losses / global count, x world size for DDP's mean).
import math
import os
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
vocab_size = 40
block_size = 16
n_embd = 32
n_head = 4
batch_size = 3  # micro-batch per rank
gradient_accumulation_steps = 4
max_iters = 10
learning_rate = 2e-3
weight_decay = 0.1
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        T = x.size(1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        # summed token loss; the caller normalises
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1), ignore_index=-1, reduction="sum")


def get_batch(it, micro_step, rank):
    g = torch.Generator().manual_seed(seed + 10007 * it + 101 * micro_step + rank)
    x = torch.randint(0, vocab_size, (batch_size, block_size + 1), generator=g)
    prompt_len = torch.randint(2, block_size - 1, (batch_size,), generator=g)
    y = x[:, 1:].clone()
    y[torch.arange(block_size)[None, :] < prompt_len[:, None] - 1] = -1  # no loss on the prompt
    return x[:, :-1], y


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = GPT()
    model = DDP(model)
    raw_model = model.module
    decay = [p for n, p in raw_model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in raw_model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=(0.9, 0.95))

    for iter_num in range(max_iters):
        window = [get_batch(iter_num, m, rank) for m in range(gradient_accumulation_steps)]
        # supervised tokens in this window on every rank
        n_tok = sum((Y != -1).sum() for _, Y in window)
        n_tok = n_tok.float()
        dist.all_reduce(n_tok)
        for micro_step, (X, Y) in enumerate(window):
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
            loss = model(X, Y) / n_tok * world
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"iter {iter_num}: tokens {int(n_tok)} loss*world {loss.item():.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw_model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
        torch.save({n: p.detach().clone() for n, p in raw_model.named_parameters()},
                   "tmp_scratch/" + os.path.basename(__file__) + ".pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
