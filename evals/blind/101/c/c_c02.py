"""CLIP-style contrastive training on 2 DDP ranks (torchrun).

In-micro-batch negatives; micro-batches of uneven size; the per-pair symmetric InfoNCE
is summed over the window and divided by the window's all-ranks pair count (times W,
because DDP averages). A learnable temperature lives inside the DDP-wrapped model,
the text token table is frozen, the window's gradient is clipped at 0.5 (it acts),
and a warm-up + cosine LambdaLR is stepped once per optimizer step. 8 micro-batches
per epoch with K = 3: windows of 3, 3, 2.
"""
import argparse
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--micro-per-epoch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=5)
    return p.parse_args()


class TinyCLIP(nn.Module):
    def __init__(self, img_dim=20, vocab=30, txt_len=6, dim=24):
        super().__init__()
        self.img_enc = nn.Sequential(nn.Linear(img_dim, 48), nn.GELU(), nn.Linear(48, dim))
        self.tok = nn.Embedding(vocab, 32)
        self.txt_enc = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, dim))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, img, txt):
        zi = F.normalize(self.img_enc(img), dim=-1)
        zt = F.normalize(self.txt_enc(self.tok(txt).mean(1)), dim=-1)
        return self.logit_scale.exp().clamp(max=100) * zi @ zt.t()


def pairs(seed, epoch, rank, idx):
    g = torch.Generator().manual_seed(seed * 1000003 + epoch * 977 + rank * 31 + idx)
    n = int(torch.randint(3, 9, (1,), generator=g))
    txt = torch.randint(0, 30, (n, 6), generator=g)
    img = F.one_hot(txt[:, :2], 30).float().sum(1)[:, :20] + 0.3 * torch.randn(n, 20, generator=g)
    return img, txt


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    model = TinyCLIP()
    model.tok.weight.requires_grad_(False)  # pretrained token table, kept frozen
    ddp = DDP(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                            lr=args.lr, weight_decay=0.1)
    windows_per_epoch = math.ceil(args.micro_per_epoch / args.accum)
    total_updates = args.epochs * windows_per_epoch

    def lr_lambda(u):
        if u < args.warmup:
            return (u + 1) / args.warmup
        prog = (u - args.warmup) / max(1, total_updates - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)

    for epoch in range(args.epochs):
        micro = [pairs(args.seed, epoch, rank, i) for i in range(args.micro_per_epoch)]
        for w0 in range(0, len(micro), args.accum):
            window = micro[w0:w0 + args.accum]
            count = torch.tensor(float(sum(b[0].shape[0] for b in window)))
            dist.all_reduce(count)
            for j, (img, txt) in enumerate(window):
                ddp.require_backward_grad_sync = j == len(window) - 1
                logits = ddp(img, txt)
                target = torch.arange(logits.size(0))
                per_pair_sum = 0.5 * (F.cross_entropy(logits, target, reduction="sum")
                                      + F.cross_entropy(logits.t(), target, reduction="sum"))
                (per_pair_sum * world / count).backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                print(f"epoch {epoch} window@{w0} grad_norm {gnorm:.3f} lr {sched.get_last_lr()[0]:.2e}",
                      flush=True)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
