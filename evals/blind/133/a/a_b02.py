"""Image-feature classifier trained with DDP; the global batch is fixed and the
number of accumulation steps is derived from it, the micro-batch size and the
number of ranks (so the same run config works on 1, 2 or 8 workers)."""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Classifier(nn.Module):
    def __init__(self, d_in=24, d_hidden=48, n_cls=6):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden), nn.ReLU())
        self.head = nn.Linear(d_hidden, n_cls)

    def forward(self, x):
        return self.head(self.body(x))


def make_dataset(seed, n=192, d_in=24, n_cls=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, n_cls, generator=g)
    y = (x @ w + 0.5 * torch.randn(n, n_cls, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self._setup_schedule()
        torch.manual_seed(args.seed)
        self.model = DDP(Classifier())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=args.momentum)
        ds = make_dataset(args.seed)
        self.sampler = DistributedSampler(ds, num_replicas=self.world, rank=self.rank, shuffle=True, seed=args.seed)
        self.loader = DataLoader(ds, batch_size=args.micro_batch, sampler=self.sampler, drop_last=True)

    def _setup_schedule(self):
        a = self.args
        assert a.global_batch % (a.micro_batch * self.world) == 0
        # micro-batches that make up one global batch, over all workers
        self.micro_batches_per_step = a.global_batch // a.micro_batch
        # ... of which each worker runs this many between two optimizer steps
        self.accum_steps = self.micro_batches_per_step // self.world
        if self.rank == 0:
            print(f"global batch {a.global_batch}: {self.accum_steps} accumulation steps x {self.world} workers", flush=True)

    def training_step(self, batch):
        x, y = batch
        loss = F.cross_entropy(self.model(x), y)
        return loss / self.micro_batches_per_step

    def fit(self):
        step = 0
        for epoch in range(self.args.epochs):
            self.sampler.set_epoch(epoch)
            for i, batch in enumerate(self.loader):
                boundary = (i + 1) % self.accum_steps == 0
                ctx = contextlib.nullcontext() if boundary else self.model.no_sync()
                with ctx:
                    loss = self.training_step(batch)
                    loss.backward()
                if boundary:
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    step += 1
            if self.rank == 0:
                print(f"epoch {epoch} done, {step} optimizer steps", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = Trainer(args)
    trainer.fit()
    d = trainer.digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
