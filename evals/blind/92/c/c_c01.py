"""nanoGPT-style char LM on spawned ranks, no DDP wrapper: one flat all-reduce per window.

Epochs of 10 micro-batches per rank with K = 4 -> windows of 4, 4 and a short one of 2.
The loss of a window is the sum of token losses / all-ranks valid-token count of that window.
Phase 1 trains one epoch and checkpoints; phase 2 rebuilds every object and resumes.
"""
import hashlib
import math
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
PORT = 45241
K = 4
MICRO_PER_EPOCH = 10
EPOCHS = 3
B, T, V = 4, 24, 40
LR, MIN_LR, WARMUP = 3e-3, 3e-4, 2
GRAD_CLIP = 0.5
UPDATES_PER_EPOCH = math.ceil(MICRO_PER_EPOCH / K)
MAX_UPDATES = UPDATES_PER_EPOCH * EPOCHS


class Block(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, nh, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, d=48, nh=4, nl=2):
        super().__init__()
        self.wte = nn.Embedding(V, d)
        self.wpe = nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, nh) for _ in range(nl))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), 1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for b in self.blocks:
            x = b(x, mask)
        return self.lm_head(self.ln_f(x))


def get_lr(it):
    if it < WARMUP:
        return LR * (it + 1) / WARMUP
    r = (it - WARMUP) / max(1, MAX_UPDATES - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * r)) * (LR - MIN_LR)


def get_batch(rank, epoch, i):
    g = torch.Generator().manual_seed(31 + 1_000 * rank + 100 * epoch + i)
    x = torch.randint(1, V, (B, T + 1), generator=g)
    lens = torch.randint(T // 3, T + 1, (B,), generator=g)
    y = x[:, 1:].clone()
    y[torch.arange(T)[None] >= lens[:, None]] = -100
    return x[:, :-1], y


def windows(rank, epoch):
    idx = list(range(MICRO_PER_EPOCH))
    for s in range(0, len(idx), K):
        yield [get_batch(rank, epoch, i) for i in idx[s:s + K]]


def build():
    torch.manual_seed(0)
    model = GPT()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))
    return model, opt


def sync_grads(model):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def train_epochs(rank, model, opt, it, epochs):
    for epoch in epochs:
        for win in windows(rank, epoch):
            n_tok = torch.tensor(float(sum(int((y != -100).sum()) for _, y in win)))
            dist.all_reduce(n_tok)
            for x, y in win:
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, V), y.view(-1), ignore_index=-100, reduction="sum")
                (loss / n_tok).backward()
            sync_grads(model)  # sum over ranks of per-rank sums / global count
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            for g in opt.param_groups:
                g["lr"] = get_lr(it)
            opt.step()
            opt.zero_grad(set_to_none=True)
            it += 1
    return it


def worker(rank, ckpt):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.use_deterministic_algorithms(True)

    model, opt = build()
    it = train_epochs(rank, model, opt, 0, range(0, 1))
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "iter": it, "epoch": 1}, ckpt)
    dist.barrier()
    del model, opt

    model, opt = build()
    state = torch.load(ckpt, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    it = train_epochs(rank, model, opt, state["iter"], range(state["epoch"], EPOCHS))
    assert it == MAX_UPDATES

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(os.path.join(d, "ckpt.pt"),), nprocs=WORLD, join=True)
