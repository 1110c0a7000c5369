"""Sequence classifier on DDP with a fused (in-backward) optimizer step.

The per-parameter optimizer runs from a post-accumulate-grad hook so that the
gradient of each parameter can be released as soon as it is used (the
"optimizer step in backward" memory trick). Micro-batches are accumulated
under DDP's no_sync.
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


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=96)
    ap.add_argument("--dim", type=int, default=48)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=6)
    ap.add_argument("--grad-accum", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=2e-3)
    return ap.parse_args()


class TinyEncoder(nn.Module):
    def __init__(self, vocab, dim, n_cls=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mix = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, n_cls)

    def forward(self, ids):
        h = self.emb(ids)
        h = self.norm(h + self.mix(h))
        return self.out(h.mean(1))


class FusedStepTrainer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = DDP(TinyEncoder(args.vocab, args.dim))
        self.opt_for = {p: torch.optim.AdamW([p], lr=args.lr, weight_decay=0.0)
                        for p in self.model.parameters()}

    def _step_param(self, p):
        self.opt_for[p].step()
        self.opt_for[p].zero_grad(set_to_none=True)

    def data(self):
        a = self.args
        g = torch.Generator().manual_seed(a.seed + 1)
        n = a.steps * a.grad_accum * self.world * a.micro_batch
        ids = torch.randint(0, a.vocab, (n, a.seq_len), generator=g)
        y = (ids[:, :4].sum(1) % 4)
        ids, y = ids[self.rank::self.world], y[self.rank::self.world]
        for i in range(0, ids.shape[0], a.micro_batch):
            yield ids[i:i + a.micro_batch], y[i:i + a.micro_batch]

    def micro_step(self, ids, y, sync):
        ctx = contextlib.nullcontext() if sync else self.model.no_sync()
        with ctx:
            loss = F.cross_entropy(self.model(ids), y) / self.args.grad_accum
            loss.backward()

    def fit(self):
        K = self.args.grad_accum
        for i, (ids, y) in enumerate(self.data()):
            self.micro_step(ids, y, sync=(i + 1) % K == 0)
            if (i + 1) % K == 0:
                for p in self.model.parameters():
                    self._step_param(p)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    tr = FusedStepTrainer(args)
    tr.fit()
    d = tr.digest()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
