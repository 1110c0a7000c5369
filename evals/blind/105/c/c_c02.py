"""nanoGPT-style loop with fp16 autocast + GradScaler on CPU, preempted and resumed.

torchrun, 2 ranks, DDP with no_sync inside each window. After `resume_at` updates the run
writes a checkpoint (model, optimizer, scaler, scheduler, data RNG), tears every object
down, rebuilds fresh ones, loads the checkpoint and carries on: what a preempted job does.
"""
import hashlib
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TrainConfig:
    vocab_size: int = 64
    block_size: int = 16
    n_embd: int = 32
    n_head: int = 4
    n_layer: int = 2
    batch_size: int = 4
    gradient_accumulation_steps: int = 3
    max_iters: int = 20
    resume_at: int = 9
    learning_rate: float = 5e-3
    warmup_iters: int = 4
    grad_clip: float = 0.5
    seed: int = 4242
    ckpt_dir: str = "ckpt_c_c02"


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(c.block_size, c.block_size, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class TokenStream:
    """x[t+1] = (5 x[t] + 3) mod V with 10% of tokens replaced by noise; one stream per rank."""

    def __init__(self, cfg, rank):
        self.cfg = cfg
        self.g = torch.Generator().manual_seed(cfg.seed + 31 * rank)

    def get_batch(self):
        c = self.cfg
        n = c.block_size + 1
        seq = [torch.randint(0, c.vocab_size, (c.batch_size, 1), generator=self.g)]
        for _ in range(n - 1):
            seq.append((5 * seq[-1] + 3) % c.vocab_size)
        seq = torch.cat(seq, 1)
        noise = torch.rand(seq.shape, generator=self.g) < 0.1
        seq = torch.where(noise, torch.randint(0, c.vocab_size, seq.shape, generator=self.g), seq)
        return seq[:, :-1], seq[:, 1:]


def lr_lambda_for(cfg):
    def f(step):
        if step < cfg.warmup_iters:
            return (step + 1) / cfg.warmup_iters
        ratio = (step - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * ratio))
    return f


def build(cfg, rank):
    torch.manual_seed(cfg.seed)
    raw = TinyGPT(cfg)
    model = DDP(raw)
    opt = torch.optim.AdamW(raw.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.95), weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda_for(cfg))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=4)
    data = TokenStream(cfg, rank)
    return raw, model, opt, sched, scaler, data


def train_until(cfg, state, it, stop):
    raw, model, opt, sched, scaler, data = state
    K = cfg.gradient_accumulation_steps
    while it < stop:
        for micro in range(K):
            X, Y = data.get_batch()
            with (model.no_sync() if micro < K - 1 else nullcontext()):
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = model(X, Y)
                scaler.scale(loss / K).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        sched.step()
        it += 1
        if dist.get_rank() == 0 and it % 5 == 0:
            print(f"iter {it} loss {loss.item():.4f} scale {scaler.get_scale():.0f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    return it


def main():
    cfg = TrainConfig()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)

    state = build(cfg, rank)
    it = train_until(cfg, state, 0, cfg.resume_at)

    # ---- checkpoint (each rank keeps its own data RNG) ----
    os.makedirs(cfg.ckpt_dir, exist_ok=True)
    raw, model, opt, sched, scaler, data = state
    torch.save({"model": raw.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "scaler": scaler.state_dict(), "rng": data.g.get_state(), "iter": it},
               os.path.join(cfg.ckpt_dir, f"rank{rank}.pt"))
    dist.barrier()
    del state, raw, model, opt, sched, scaler, data

    # ---- resume into fresh objects ----
    state = build(cfg, rank)
    raw, model, opt, sched, scaler, data = state
    ck = torch.load(os.path.join(cfg.ckpt_dir, f"rank{rank}.pt"), weights_only=False)
    raw.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    scaler.load_state_dict(ck["scaler"])
    data.g.set_state(ck["rng"])
    it = train_until(cfg, state, ck["iter"], cfg.max_iters)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
