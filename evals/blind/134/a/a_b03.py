"""FSDP2 (fully_shard) fine-tuning trainer: pretrained-style trunk + task head, grad accumulation."""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--pretrain-classes", type=int, default=10)
    p.add_argument("--num-labels", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Backbone(nn.Module):
    def __init__(self, dim, depth, n_out):
        super().__init__()
        self.stem = nn.Linear(16, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_out)

    def forward(self, x):
        h = self.stem(x)
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.norm(h))


class FSDPFineTuner:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = Backbone(args.dim, args.depth, args.pretrain_classes)
        self.shard_model()
        self.replace_head(args.num_labels)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01)
        self.loader, self.sampler = self.build_loader()

    def shard_model(self):
        for blk in self.model.blocks:
            fully_shard(blk)
        fully_shard(self.model)

    def replace_head(self, num_labels):
        # new task: swap the pretraining classifier for a freshly initialised one
        torch.manual_seed(self.args.seed + 1)
        self.model.head = nn.Linear(self.args.dim, num_labels)

    def build_loader(self):
        g = torch.Generator().manual_seed(self.args.seed)
        n = self.world * self.args.micro_batch * self.args.grad_accum * self.args.max_steps
        x = torch.randn(n, 16, generator=g)
        proj = torch.randn(16, self.args.num_labels, generator=g)
        y = (torch.tanh(x) @ proj).argmax(-1)
        ds = TensorDataset(x, y)
        sampler = DistributedSampler(ds, num_replicas=self.world, rank=self.rank, shuffle=True,
                                     seed=self.args.seed)
        return DataLoader(ds, batch_size=self.args.micro_batch, sampler=sampler), sampler

    def fit(self):
        K = self.args.grad_accum
        step = 0
        micro = 0
        self.sampler.set_epoch(0)
        for x, y in self.loader:
            micro += 1
            sync = micro % K == 0
            self.model.set_requires_gradient_sync(sync)
            loss = F.cross_entropy(self.model(x), y) / K
            loss.backward()
            if sync:
                self.optimizer.step()
                self.optimizer.zero_grad()
                step += 1
                if step >= self.args.max_steps:
                    break
        return step

    def digest(self):
        parts = []
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            parts.append(t.detach().float().reshape(-1))
        flat = torch.cat(parts)
        dump = os.environ.get("DUMP_DIR")
        if dump and self.rank == 0:
            torch.save(flat, os.path.join(dump, os.path.basename(__file__) + ".pt"))
        return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    tuner = FSDPFineTuner(args)
    steps = tuner.fit()
    digest = tuner.digest()
    if tuner.rank == 0:
        print(f"steps={steps}")
        print(f"FINAL_SHA256 {digest}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
