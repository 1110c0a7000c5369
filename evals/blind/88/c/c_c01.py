"""nanoGPT-style training on 2 DDP ranks, with a mid-run checkpoint and a resume
into freshly built model/optimizer objects (simulated preemption)."""
import math
import os
import shutil
import tempfile
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
block_size = 16
vocab_size = 80
n_embd = 32
n_head = 4
batch_size = 4
gradient_accumulation_steps = 2 * 3  # 3 per rank on 2 ranks
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 3
lr_decay_iters = 20
max_iters = 20
preempt_at = 9
grad_clip = 0.5
weight_decay = 0.1
out_dir = os.path.join(tempfile.gettempdir(), "blind88_c_c01_ckpt")
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        nodecay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95))


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def get_batch(it, micro_step, rank):
    g = torch.Generator().manual_seed(1_000_003 * rank + 1009 * it + micro_step)
    # a noisy "copy the token three back" language
    x = torch.randint(0, vocab_size, (batch_size, block_size + 3), generator=g)
    noise = torch.rand(x.shape, generator=g) < 0.2
    y = torch.where(noise, torch.randint(0, vocab_size, x.shape, generator=g), x)
    return x[:, 3:], y[:, :-3]


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def build():
    torch.manual_seed(1337)
    raw = GPT()
    model = DDP(raw)
    return raw, model, raw.configure_optimizers()


def train(iter_num, stop_at, raw_model, model, optimizer, rank, accum):
    while iter_num < stop_at:
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro_step in range(accum):
            model.require_backward_grad_sync = micro_step == accum - 1
            X, Y = get_batch(iter_num, micro_step, rank)
            loss = model(X, Y) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if rank == 0 and iter_num % 5 == 0:
            print(f"iter {iter_num}: loss {loss.item() * accum:.4f} lr {lr:.2e}")
    return iter_num


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    assert gradient_accumulation_steps % world == 0
    accum = gradient_accumulation_steps // world

    raw_model, model, optimizer = build()
    iter_num = train(0, preempt_at, raw_model, model, optimizer, rank, accum)
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        torch.save({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num},
                   os.path.join(out_dir, "ckpt.pt"))
    dist.barrier()
    del raw_model, model, optimizer

    # --- resume, as a restarted job would ---
    ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
    torch.manual_seed(0)
    raw_model = GPT()
    raw_model.load_state_dict(ckpt["model"])
    model = DDP(raw_model)
    optimizer = raw_model.configure_optimizers()
    optimizer.load_state_dict(ckpt["optimizer"])
    iter_num = train(ckpt["iter_num"], max_iters, raw_model, model, optimizer, rank, accum)

    if rank == 0:
        print("FINAL_SHA256", final_sha(raw_model))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(out_dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
