"""Small image-like classifier on DDP, written as a reusable trainer class.

DDP's all-reduce is skipped on the micro-steps inside a window (no_sync) to save bandwidth.
"""
import argparse
import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--accum-steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=6)
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
        )
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


class Trainer:
    def __init__(self, args):
        self.args = args
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = DDP(ConvNet())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
        self.micro_step = 0
        self.global_step = 0
        g = torch.Generator().manual_seed(args.seed + self.rank)
        n = args.batch_size * args.accum_steps * args.max_steps
        self.images = torch.randn(n, 1, 8, 8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def batches(self):
        bs = self.args.batch_size
        for i in range(0, len(self.images), bs):
            yield self.images[i:i + bs], self.labels[i:i + bs]

    def sync_context(self):
        # only talk to the other ranks on the micro-step that closes the window
        if self.micro_step % self.args.accum_steps != 0:
            return self.model.no_sync()
        return nullcontext()

    def training_step(self, x, y):
        with self.sync_context():
            out = self.model(x)
            loss = nn.functional.cross_entropy(out, y) / self.args.accum_steps
            loss.backward()
        self.micro_step += 1

    def maybe_step(self):
        if self.micro_step % self.args.accum_steps == 0:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.global_step += 1

    def fit(self):
        for x, y in self.batches():
            self.training_step(x, y)
            self.maybe_step()

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    t = Trainer(get_args())
    t.fit()
    if t.rank == 0:
        print(f"FINAL_SHA256 {t.digest()}", flush=True)
    dist.destroy_process_group()
