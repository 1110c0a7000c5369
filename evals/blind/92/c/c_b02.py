"""Masked-diffusion language model (MDLM/LLaDA-style absorbing-state objective), DDP + no_sync.

Each sequence gets its own mask ratio t ~ U(eps, 1); the loss is cross-entropy on the
masked positions, averaged over all masked tokens of the optimizer step.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB = 48
PAD = 0
MASK = VOCAB  # extra absorbing token


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--max-len", type=int, default=32)
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Denoiser(nn.Module):
    def __init__(self, d=64, n_layer=2, max_len=32):
        super().__init__()
        self.tok = nn.Embedding(VOCAB + 1, d)
        self.pos = nn.Embedding(max_len, d)
        self.t_emb = nn.Linear(1, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, xt, t, pad_mask):
        pos = torch.arange(xt.shape[1])
        h = self.tok(xt) + self.pos(pos)[None] + self.t_emb(t[:, None])[:, None]
        h = self.blocks(h, src_key_padding_mask=pad_mask)
        return self.head(self.ln(h))


def make_micro_batch(args, rank, it, micro):
    g = torch.Generator().manual_seed(args.seed * 7919 + rank * 104729 + it * 131 + micro)
    lens = torch.randint(6, args.max_len + 1, (args.micro_bs,), generator=g)
    x0 = torch.randint(1, VOCAB, (args.micro_bs, args.max_len), generator=g)
    ar = torch.arange(args.max_len)[None]
    pad_mask = ar >= lens[:, None]
    x0 = x0.masked_fill(pad_mask, PAD)
    t = 0.05 + 0.95 * torch.rand(args.micro_bs, generator=g)
    masked = (torch.rand(args.micro_bs, args.max_len, generator=g) < t[:, None]) & ~pad_mask
    xt = x0.masked_fill(masked, MASK)
    return dict(x0=x0, xt=xt, t=t, pad_mask=pad_mask, masked=masked)


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    model = DDP(Denoiser(max_len=args.max_len))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    K = args.grad_accum

    for it in range(args.iters):
        window = [make_micro_batch(args, rank, it, m) for m in range(K)]
        n_masked = torch.tensor(float(sum(int(b["masked"].sum()) for b in window)))
        dist.all_reduce(n_masked)  # for the tokens/step log line
        for m, b in enumerate(window):
            ctx = model.no_sync() if m < K - 1 else contextlib.nullcontext()
            with ctx:
                logits = model(b["xt"], b["t"], b["pad_mask"])
                ce = F.cross_entropy(logits[b["masked"]], b["x0"][b["masked"]])
                loss = ce / K
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and it % 3 == 0:
            print(f"iter {it} ce {ce.item():.4f} masked tokens/step {int(n_masked)}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
