"""
Tiny nanoGPT-style pretraining run on a packed token stream, DDP over gloo.

  torchrun --nproc-per-node 2 a_b01.py

Documents of random length are joined with an EOT token and packed into one
stream; every micro-batch is `batch_size` contiguous blocks of `block_size + 1`
tokens, so every micro-batch has the same number of target tokens and the
per-micro-batch mean / K is the window mean.
"""
import hashlib
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# config (nanoGPT style: plain globals)
out_dir = "out"
batch_size = 4
block_size = 32
gradient_accumulation_steps = 8  # global; divided by the world size below
n_layer = 2
n_head = 2
n_embd = 48
vocab_size = 96
dropout = 0.0
bias = False
learning_rate = 3e-3
max_iters = 16
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 3
lr_decay_iters = 16
min_lr = 3e-4
compile = True
compile_backend = "aot_eager"  # CPU box: no inductor toolchain needed
seed = 1337
# -----------------------------------------------------------------------------

torch.use_deterministic_algorithms(True)


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block() for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
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


def build_stream(n_tokens, gen):
    """Random-length 'documents' joined by EOT (token 0), packed into one stream."""
    out, total = [], 0
    while total < n_tokens:
        L = int(torch.randint(4, 40, (1,), generator=gen))
        doc = torch.randint(1, vocab_size, (L,), generator=gen)
        # a little structure so the loss can go down: token t+1 = token t + 1 half the time
        doc[1::2] = (doc[0::2][: doc[1::2].numel()] % (vocab_size - 1)) + 1
        out.append(doc)
        out.append(torch.zeros(1, dtype=torch.long))
        total += L + 1
    return torch.cat(out)[:n_tokens]


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def main():
    global gradient_accumulation_steps
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        dist.init_process_group(backend="gloo")
        ddp_rank = int(os.environ["RANK"])
        ddp_world_size = int(os.environ["WORLD_SIZE"])
        master_process = ddp_rank == 0
        seed_offset = ddp_rank
        assert gradient_accumulation_steps % ddp_world_size == 0
        gradient_accumulation_steps //= ddp_world_size
    else:
        ddp_rank, ddp_world_size, master_process, seed_offset = 0, 1, True, 0

    torch.manual_seed(seed)
    ctx = nullcontext()

    # data: one shared stream, each rank reads its own interleaved blocks
    data = build_stream(200_000, torch.Generator().manual_seed(seed))
    data_gen = torch.Generator().manual_seed(seed + seed_offset)

    def get_batch():
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=data_gen)
        x = torch.stack([data[i:i + block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    model = GPT()
    if ddp:
        model = DDP(model)
    ddp_model = model if ddp else None
    raw_model = model.module if ddp else model
    optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))
    if compile:
        if master_process:
            print("compiling the model... (takes a ~few seconds)")
        model = torch.compile(model, backend=compile_backend)

    X, Y = get_batch()
    iter_num = 0
    while True:
        lr = get_lr(iter_num) if decay_lr else learning_rate
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        for micro_step in range(gradient_accumulation_steps):
            if ddp:
                ddp_model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            with ctx:
                logits, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps
            X, Y = get_batch()
            loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        if master_process and iter_num % 4 == 0:
            print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, lr {lr:.2e}")
        iter_num += 1
        if iter_num >= max_iters:
            break

    if master_process:
        h = hashlib.sha256()
        for _, p in raw_model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    if ddp:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
