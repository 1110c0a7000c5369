"""nanoGPT-style pretraining of a tiny GPT with a Megatron-style gradient buffer.

Each parameter's gradient is moved into a persistent `main_grad` buffer by a
post-accumulate hook right after every backward (so `.grad` is freed at once), and the
window's buffer is all-reduced once per optimizer step: data parallelism by hand.
Launch with torchrun on 2 processes.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# config
seed = 1337
vocab_size = 96
block_size = 32
n_layer = 2
n_head = 4
n_embd = 64
batch_size = 4                     # micro-batch size per rank
gradient_accumulation_steps = 8
max_iters = 24
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 4
lr_decay_iters = 24
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
main_grad_dtype = torch.float32    # dtype of the accumulation buffer
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
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.float().view(-1, vocab_size), targets.view(-1))
        return logits, loss


class GradBuffer:
    """Megatron-style main_grad: gradients are accumulated outside `.grad`."""

    def __init__(self, model, dtype):
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            p.main_grad = torch.zeros_like(p, dtype=dtype)
            p.register_post_accumulate_grad_hook(self._hook)

    @staticmethod
    def _hook(p):
        p.main_grad.add_(p.grad)
        p.grad = None

    def reduce_into_grads(self, world_size):
        flat = torch.cat([p.main_grad.float().view(-1) for p in self.params])
        dist.all_reduce(flat)
        flat.div_(world_size)
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[off:off + n].view_as(p).clone()
            off += n

    def zero(self):
        for p in self.params:
            p.main_grad.zero_()
            p.grad = None


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def make_corpus(n_tokens):
    # a noisy order-2 Markov chain so the model has something to learn
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, vocab_size, (vocab_size, vocab_size), generator=g)
    noise = torch.rand(n_tokens, generator=g) < 0.2
    rnd = torch.randint(0, vocab_size, (n_tokens,), generator=g)
    data = torch.empty(n_tokens, dtype=torch.long)
    data[0], data[1] = 1, 2
    for i in range(2, n_tokens):
        data[i] = rnd[i] if noise[i] else table[data[i - 2], data[i - 1]]
    return data


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    master_process = rank == 0

    train_data = make_corpus(20000)
    data_gen = torch.Generator().manual_seed(seed + rank)

    def get_batch():
        ix = torch.randint(len(train_data) - block_size - 1, (batch_size,), generator=data_gen)
        x = torch.stack([train_data[i:i + block_size] for i in ix])
        y = torch.stack([train_data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    torch.manual_seed(seed)
    model = GPT()
    buffer = GradBuffer(model, main_grad_dtype)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=learning_rate, betas=(beta1, beta2))

    X, Y = get_batch()
    for iter_num in range(max_iters):
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr

        for micro_step in range(gradient_accumulation_steps):
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch()
            loss.backward()

        buffer.reduce_into_grads(world_size)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        buffer.zero()

        if master_process and iter_num % 6 == 0:
            print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, lr {lr:.2e}")

    if master_process:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
