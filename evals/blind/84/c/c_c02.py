"""nanoGPT-style DDP training with a checkpoint and a resume into fresh objects.

Weight-tied lm_head, a frozen (fixed sinusoidal) position table, cosine LR by optimizer
iteration, clip after the window, `require_backward_grad_sync` only on the last micro-step.
The run stops after `stop_after` iterations, saves model/optimizer/iter_num, rebuilds
everything from scratch and resumes from the checkpoint to `max_iters`.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

config = dict(vocab_size=64, block_size=16, n_embd=32, n_head=2, n_layer=2,
              batch_size=4, gradient_accumulation_steps=3, max_iters=14, stop_after=6,
              learning_rate=3e-3, min_lr=3e-4, warmup_iters=2, grad_clip=1.0, seed=42,
              ckpt_path=os.path.join(os.path.dirname(os.path.abspath(__file__)), "c_c02_ckpt.pt"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c["n_embd"])
        self.attn = nn.MultiheadAttention(c["n_embd"], c["n_head"], batch_first=True, bias=False)
        self.ln2 = nn.LayerNorm(c["n_embd"])
        self.fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.proj = nn.Linear(4 * c["n_embd"], c["n_embd"])

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        pos = torch.arange(c["block_size"])[:, None]
        div = torch.exp(torch.arange(0, c["n_embd"], 2) * (-math.log(10000.0) / c["n_embd"]))
        with torch.no_grad():
            self.wpe.weight[:, 0::2] = torch.sin(pos * div)
            self.wpe.weight[:, 1::2] = torch.cos(pos * div)
        self.wpe.weight.requires_grad_(False)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(c["n_embd"])
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def forward(self, idx, targets):
        T = idx.size(1)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def get_lr(it, c):
    if it < c["warmup_iters"]:
        return c["learning_rate"] * (it + 1) / c["warmup_iters"]
    r = (it - c["warmup_iters"]) / (c["max_iters"] - c["warmup_iters"])
    return c["min_lr"] + 0.5 * (1 + math.cos(math.pi * r)) * (c["learning_rate"] - c["min_lr"])


def get_batch(it, micro, rank, c):
    g = torch.Generator().manual_seed(c["seed"] + 7919 * it + 31 * micro + rank)
    start = torch.randint(0, c["vocab_size"], (c["batch_size"], 1), generator=g)
    step = torch.randint(1, 4, (c["batch_size"], 1), generator=g)
    seq = (start + step * torch.arange(c["block_size"] + 1)) % c["vocab_size"]
    noise = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, c["vocab_size"], seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


def build(c):
    torch.manual_seed(c["seed"])
    raw = GPT(c)
    model = DDP(raw)
    params = [p for p in raw.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["learning_rate"], betas=(0.9, 0.95))
    return raw, model, opt


def train(raw, model, opt, iter_num, until, c, rank):
    K = c["gradient_accumulation_steps"]
    while iter_num < until:
        for g in opt.param_groups:
            g["lr"] = get_lr(iter_num, c)
        for micro_step in range(K):
            model.require_backward_grad_sync = micro_step == K - 1
            X, Y = get_batch(iter_num, micro_step, rank, c)
            loss = model(X, Y) / K
            loss.backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), c["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and iter_num % 4 == 0:
            print(f"iter {iter_num} loss {loss.item() * K:.4f}", flush=True)
        iter_num += 1
    return iter_num


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    c = config
    raw, model, opt = build(c)
    iter_num = train(raw, model, opt, 0, c["stop_after"], c, rank)
    if rank == 0:
        torch.save({"model": raw.state_dict(), "optimizer": opt.state_dict(), "iter_num": iter_num},
                   c["ckpt_path"])
    dist.barrier()
    del raw, model, opt

    # --- resume into brand-new objects ---
    raw, model, opt = build(c)
    ckpt = torch.load(c["ckpt_path"], map_location="cpu")
    raw.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    iter_num = ckpt["iter_num"]
    if rank == 0:
        print(f"resumed at iter {iter_num}", flush=True)
    train(raw, model, opt, iter_num, c["max_iters"], c, rank)

    dist.barrier()
    if rank == 0:
        os.remove(c["ckpt_path"])
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in raw.named_parameters()])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
