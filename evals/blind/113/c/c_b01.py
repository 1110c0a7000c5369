"""
Small nanoGPT-flavoured trainer, data parallel by hand.

We do not wrap the model in DDP: every rank accumulates `gradient_accumulation_steps`
micro-batches locally and the gradients are averaged over ranks once per optimizer
step with a single flattened all-reduce (cheaper than DDP's bucketing for a model this
small). Launch with torchrun.
"""
import math
import os
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


# ----------------------------------------------------------------------------- model
@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 80
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 48
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)


# ----------------------------------------------------------------------------- config
batch_size = 4
block_size = 32
gradient_accumulation_steps = 4
max_iters = 20
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 4
lr_decay_iters = 20
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
seed = 1337


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def make_corpus(vocab_size, n_tokens, seed):
    # a fixed random first-order Markov chain, so there is something to learn
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(torch.randn(vocab_size, vocab_size, generator=g) * 3.0, dim=-1)
    toks = torch.empty(n_tokens, dtype=torch.long)
    toks[0] = 0
    nxt = torch.multinomial(trans, n_tokens, replacement=True, generator=g)  # (V, n)
    for i in range(1, n_tokens):
        toks[i] = nxt[toks[i - 1], i]
    return toks


def allreduce_grads(optimizer, world_size):
    """Average .grad over ranks: one flat bucket, one all-reduce."""
    for group in optimizer.param_groups:
        grads = [p.grad for p in group["params"] if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat.div_(world_size)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)


def main():
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(seed)  # same init on every rank

    model = GPT(GPTConfig(block_size=block_size))
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))

    data = make_corpus(model.config.vocab_size, 20000, seed)
    gen = torch.Generator().manual_seed(seed + 1000 * rank)

    def get_batch():
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
        x = torch.stack([data[i:i + block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    X, Y = get_batch()
    for iter_num in range(max_iters):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        for micro_step in range(gradient_accumulation_steps):
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch()  # prefetch next
            loss.backward()

        allreduce_grads(optimizer, world_size)
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        if rank == 0 and iter_num % 5 == 0:
            print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f} lr {lr:.2e}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
