"""Small LM trained with FSDP2 under torchrun; gradient accumulation folded into the
reduce-scatter.

Each micro-batch's loss is its plain mean (no 1/K); the 1/(micro-batches x ranks) of the
window average is applied by FSDP2's gradient divide factor, which is set for every FSDP
unit at the start of each window. Epochs have 8 micro-batches per rank, so with K = 3 the
windows are 3, 3, 2 and the last one is divided by its own size. Position table frozen.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule, fully_shard


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, seq=16, d=32, heads=4, n_layer=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1), persistent=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for b in self.blocks:
            x = b(x, self.mask[: idx.size(1), : idx.size(1)])
        return self.lm_head(self.ln_f(x))


def micro_batches(epoch, rank, n, bs, seq, vocab):
    g = torch.Generator().manual_seed(500 + 1000 * epoch + rank)
    for _ in range(n):
        x = torch.randint(0, vocab, (bs, seq + 1), generator=g)
        x[:, 1::2] = (x[:, 0:-1:2] * 5 + 2) % vocab
        yield x[:, :-1], x[:, 1:]


def windows(it, k):
    buf = []
    for item in it:
        buf.append(item)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batches_per_epoch", type=int, default=8)
    ap.add_argument("--grad_accum", type=int, default=3)
    ap.add_argument("--micro_bs", type=int, default=4)
    ap.add_argument("--clip", type=float, default=0.3)
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = GPT()
    model.wpe.weight.requires_grad_(False)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    fsdp_units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in fsdp_units:
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)

    step = 0
    for epoch in range(args.epochs):
        data = micro_batches(epoch, rank, args.batches_per_epoch, args.micro_bs, 16, 64)
        for win in windows(data, args.grad_accum):
            for unit in fsdp_units:
                unit.set_gradient_divide_factor(float(len(win) * world))
            for j, (idx, tgt) in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                logits = model(idx)
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
                loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if rank == 0 and step % 3 == 0:
                print(f"epoch {epoch} step {step} window {len(win)} loss {loss.item():.4f} gnorm {gnorm.full_tensor().item():.3f}", flush=True)

    h = hashlib.sha256()
    full = {}
    for name, p in model.named_parameters():
        t = p.full_tensor().detach().float()
        full[name] = t
        h.update(t.contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if args.dump:
            torch.save(full, args.dump)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
