"""nanoGPT-style character LM, ported from DDP to DeepSpeed ZeRO-1 for optimizer-state sharding.

Same loop as train.py: `gradient_accumulation_steps` micro-steps with `loss / K`, then one
update, cosine LR set by hand each iteration. Synthetic token data.
"""
import hashlib
import math
import os

import torch
import torch.nn as nn
from torch.nn import functional as F
import deepspeed

# -----------------------------------------------------------------------------
# config (nanoGPT style globals)
batch_size = 4
block_size = 32
gradient_accumulation_steps = 4
n_layer, n_head, n_embd, vocab_size = 2, 4, 48, 64
dropout = 0.0
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 3
max_iters = 16
lr_decay_iters = 16
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 0.0  # disabled
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=dropout, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        T = idx.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for blk in self.h:
            x = blk(x, mask)
        logits = self.lm_head(self.ln_f(x))
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


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    torch.manual_seed(seed)

    # a synthetic "corpus": a noisy order-2 Markov chain over the vocabulary
    g = torch.Generator().manual_seed(seed)
    trans = torch.randint(0, vocab_size, (vocab_size, vocab_size), generator=g)
    data = torch.empty(20000, dtype=torch.long)
    data[:2] = torch.tensor([1, 2])
    noise = torch.randint(0, vocab_size, (20000,), generator=g)
    flip = torch.rand(20000, generator=g) < 0.2
    for i in range(2, 20000):
        data[i] = noise[i] if flip[i] else trans[data[i - 2], data[i - 1]]

    batch_gen = torch.Generator().manual_seed(seed + 1 + rank)

    def get_batch():
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=batch_gen)
        x = torch.stack([data[i:i + block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model = GPT()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate, betas=(beta1, beta2),
    )
    ds_config = {
        # grad accumulation is done by our own micro-step loop below, as in train.py
        "train_micro_batch_size_per_gpu": batch_size,
        "train_batch_size": batch_size * ddp_world_size,
        "gradient_clipping": grad_clip,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
    }
    model_engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

    X, Y = get_batch()
    for iter_num in range(max_iters):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        for micro_step in range(gradient_accumulation_steps):
            logits, loss = model_engine(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch()
            model_engine.backward(loss)
        model_engine.step()
        if rank == 0 and iter_num % 5 == 0:
            print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f} lr {lr:.2e}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model_engine.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
