"""Churn classifier on tabular features, DeepSpeed ZeRO-1 on 2 ranks.

Launch with the deepspeed launcher (see b_b01.cmd). Gradient accumulation is set
in the DeepSpeed config from --grad_accum.
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args():
    p = argparse.ArgumentParser(description="churn model, ZeRO-1")
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--micro_batch", type=int, default=8)
    p.add_argument("--grad_accum", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--n_samples", type=int, default=320)
    p.add_argument("--n_features", type=int, default=24)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


class ChurnNet(nn.Module):
    def __init__(self, n_features, hidden=64, n_classes=3):
        super().__init__()
        self.norm = nn.LayerNorm(n_features)
        self.body = nn.Sequential(
            nn.Linear(n_features, hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.GELU(),
        )
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.head(self.body(self.norm(x)))


def synthetic_churn(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 3, generator=g)
    logits = x @ w + 0.5 * torch.randn(n, 3, generator=g)
    return TensorDataset(x, logits.argmax(dim=1))


def sha256_of(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


class Runner:
    def __init__(self, args):
        self.args = args
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(args.seed)

        model = ChurnNet(args.n_features)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                      weight_decay=args.weight_decay)
        ds_config = {
            "train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": args.grad_accum,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 1},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10_000,
        }
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds_config)

        self.dataset = synthetic_churn(args.n_samples, args.n_features, args.seed + 1)
        self.sampler = DistributedSampler(self.dataset, num_replicas=self.world,
                                          rank=self.rank, shuffle=True,
                                          seed=args.seed, drop_last=True)
        self.loader = DataLoader(self.dataset, batch_size=args.micro_batch,
                                 sampler=self.sampler, drop_last=True)

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        self.engine.train()
        running = 0.0
        for step, (x, y) in enumerate(self.loader):
            logits = self.engine(x)
            loss = F.cross_entropy(logits, y)
            self.engine.backward(loss)
            # one optimizer update per accumulation window
            if (step + 1) % self.args.grad_accum == 0:
                self.engine.step()
            running += loss.item()
        return running / max(1, len(self.loader))

    def fit(self):
        for epoch in range(self.args.epochs):
            avg = self.train_epoch(epoch)
            if self.rank == 0:
                print(f"epoch {epoch} loss {avg:.4f} updates {self.engine.global_steps}")
        digest = sha256_of(self.engine.module)
        if self.rank == 0:
            print(f"FINAL_SHA256 {digest}")
        dist.barrier()


if __name__ == "__main__":
    Runner(parse_args()).fit()
