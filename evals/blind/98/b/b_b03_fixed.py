"""DDP bag-of-tokens classifier with gradual unfreezing.

The embedding table starts frozen (as if pretrained) and is released after a
few optimizer steps.  Gradient accumulation runs under DDP's no_sync() for all
but the last micro-batch of each window.
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


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=200)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--seq", type=int, default=12)
    p.add_argument("--micro-bs", type=int, default=8)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--unfreeze-at", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--emb-lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


class BagClassifier(nn.Module):
    def __init__(self, vocab, dim, classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, tok):
        return self.mlp(self.emb(tok).mean(1))


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        self.net = BagClassifier(args.vocab, args.dim, args.classes)
        self.net.emb.weight.requires_grad_(False)      # "pretrained", frozen at first
        self.model = DDP(self.net)
        self.opt = torch.optim.AdamW(
            [{"params": self.net.mlp.parameters(), "lr": args.lr},
             {"params": self.net.emb.parameters(), "lr": args.emb_lr}],
            weight_decay=0.01)
        self.data = self._make_data()

    def _make_data(self):
        a = self.args
        g = torch.Generator().manual_seed(a.seed + 1)
        n = a.steps * a.accum * a.micro_bs * self.world
        tok = torch.randint(0, a.vocab, (n, a.seq), generator=g)
        y = (tok % a.classes).mode(dim=1).values
        tok, y = tok[self.rank::self.world], y[self.rank::self.world]
        return list(zip(tok.split(a.micro_bs), y.split(a.micro_bs)))

    def maybe_unfreeze(self, step):
        if step == self.args.unfreeze_at:
            self.net.emb.weight.requires_grad_(True)
            # DDP registers only the parameters that require grad at
            # construction: rebuild the wrapper so the embedding is reduced too
            self.model = DDP(self.net)
            if self.rank == 0:
                print(f"step {step}: unfreezing embedding", flush=True)

    def train_window(self, window):
        for i, (tok, y) in enumerate(window):
            last = i == len(window) - 1
            ctx = contextlib.nullcontext() if last else self.model.no_sync()
            with ctx:
                loss = F.cross_entropy(self.model(tok), y) / len(window)
                loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item() * len(window)

    def fit(self):
        K = self.args.accum
        for step in range(self.args.steps):
            self.maybe_unfreeze(step)
            loss = self.train_window(self.data[step * K:(step + 1) * K])
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} loss {loss:.4f}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.net.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = Trainer(args)
    trainer.fit()
    sha = trainer.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
