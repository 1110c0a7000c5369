"""Tiny next-token model on DDP (torchrun, 2 ranks), bf16 autocast, an embedding
parameter group with its own LR, a global-norm clip per update and periodic
checkpoints written by rank 0 every `ckpt_interval` iterations.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))

parser = argparse.ArgumentParser()
parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--block_size", type=int, default=16)
parser.add_argument("--max_iters", type=int, default=32)        # micro-batches per rank
parser.add_argument("--ckpt_interval", type=int, default=6)
parser.add_argument("--learning_rate", type=float, default=3e-3)
parser.add_argument("--emb_lr_mult", type=float, default=0.3)
parser.add_argument("--grad_clip", type=float, default=1.0)
parser.add_argument("--vocab", type=int, default=97)
parser.add_argument("--seed", type=int, default=2024)


class TinyLM(nn.Module):
    def __init__(self, vocab, d=48, block=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.mix = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.size(1))
        h = self.wte(idx) + self.wpe(pos)
        h = h + self.mix(h)
        return self.lm_head(self.ln_f(h))


def get_batch(data, it, rank, world, a):
    g = torch.Generator().manual_seed(a.seed * 1000 + it * world + rank)
    ix = torch.randint(len(data) - a.block_size - 1, (a.batch_size,), generator=g)
    x = torch.stack([data[i: i + a.block_size] for i in ix])
    y = torch.stack([data[i + 1: i + 1 + a.block_size] for i in ix])
    return x, y


def save_checkpoint(model, optimizer, it, path):
    # drop the gradient buffers first so they are not held alongside the state copies
    optimizer.zero_grad(set_to_none=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter": it}, path)


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    a = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    K = a.gradient_accumulation_steps

    g = torch.Generator().manual_seed(a.seed + 1)
    # a slightly structured stream: repeated random motifs
    motifs = torch.randint(a.vocab, (20, 8), generator=g)
    data = motifs[torch.randint(20, (2000,), generator=g)].flatten()

    raw = TinyLM(a.vocab, block=a.block_size)
    model = DDP(raw)
    emb = [raw.wte.weight, raw.wpe.weight]
    rest = [p for n, p in raw.named_parameters() if not n.startswith(("wte", "wpe"))]
    optimizer = torch.optim.AdamW(
        [{"params": rest, "lr": a.learning_rate},
         {"params": emb, "lr": a.learning_rate * a.emb_lr_mult, "weight_decay": 0.0}],
        weight_decay=0.1)
    ckpt_path = os.path.join(HERE, "tmp_scratch", os.path.basename(__file__) + ".ckpt")

    for it in range(1, a.max_iters + 1):
        x, y = get_batch(data, it, rank, world, a)
        model.require_backward_grad_sync = it % K == 0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), y.view(-1)) / K
        loss.backward()

        if rank == 0 and it % a.ckpt_interval == 0:
            save_checkpoint(raw, optimizer, it, ckpt_path)

        if it % K == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    sha = param_sha(raw)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}")
        if os.path.exists(ckpt_path):
            os.remove(ckpt_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
