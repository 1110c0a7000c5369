"""nanoGPT-flavoured char LM on 2 spawned ranks without DDP: one flat all-reduce per window.

Documents are padded (targets -100), so micro-batches carry different token counts. The
loss of a window is the token mean over every valid target of the window on all ranks; the
epoch of 10 micro-batches per rank ends in a short window of 2 (K = 4). Gradients are
clipped at 0.5 after the all-reduce.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD, PORT = 2, 42241
VOCAB, BLOCK, D = 40, 16, 32
MICRO_BS, GRAD_ACCUM, MICRO_PER_EPOCH, EPOCHS = 4, 4, 10, 3
LR, MIN_LR, CLIP = 3e-3, 3e-4, 0.5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.register_buffer("mask", torch.triu(torch.ones(BLOCK, BLOCK, dtype=torch.bool), 1))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[: x.size(1), : x.size(1)], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(BLOCK, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def get_batch(g):
    x = torch.randint(1, VOCAB, (MICRO_BS, BLOCK), generator=g)
    y = torch.roll(x, -1, dims=1)
    lens = torch.randint(3, BLOCK + 1, (MICRO_BS,), generator=g)
    pad = torch.arange(BLOCK)[None, :] >= lens[:, None]
    x[pad] = 0
    y[pad] = -100
    return x, y


def get_lr(it, total):
    warm = 2
    if it < warm:
        return LR * (it + 1) / warm
    r = (it - warm) / max(1, total - warm)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * r)) * (LR - MIN_LR)


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(1337)
    torch.use_deterministic_algorithms(True)
    model = GPT()
    params = [p for p in model.parameters()]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    steps_per_epoch = math.ceil(MICRO_PER_EPOCH / GRAD_ACCUM)
    total_iters = EPOCHS * steps_per_epoch
    data_g = torch.Generator().manual_seed(2024 + rank)

    it = 0
    for epoch in range(EPOCHS):
        batches = [get_batch(data_g) for _ in range(MICRO_PER_EPOCH)]
        for start in range(0, MICRO_PER_EPOCH, GRAD_ACCUM):
            window = batches[start:start + GRAD_ACCUM]
            n_tok = torch.tensor(float(sum(int((y != -100).sum()) for _, y in window)))
            dist.all_reduce(n_tok)
            for g in optimizer.param_groups:
                g["lr"] = get_lr(it, total_iters)
            for x, y in window:
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1), ignore_index=-100, reduction="sum")
                (loss / n_tok).backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)  # SUM: the loss is already over the all-ranks count
            off = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[off:off + n].view_as(p))
                off += n
            norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if rank == 0:
                print(f"iter {it} window {len(window)} tokens {int(n_tok)} gnorm {norm:.3f}", flush=True)
            it += 1

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
