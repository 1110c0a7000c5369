"""Small-image classifier trained with a timm-style trainer class on DDP.

Gradient accumulation over K micro-batches; the loss scaler helper does the
backward, the clip and (on the window's last micro-batch) the optimizer step.
"""
import argparse
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--clip-grad", type=float, default=0.2)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class NativeScalerWithClip:
    """Loss scaler in the style of timm.utils.NativeScaler."""

    state_dict_key = "amp_scaler"

    def __init__(self, enabled=False):
        self._scaler = torch.amp.GradScaler("cpu", enabled=enabled)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, need_update=True):
        self._scaler.scale(loss).backward()
        if need_update:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()


class SmallConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.norm1 = nn.GroupNorm(4, 16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.norm2 = nn.GroupNorm(4, 32)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        x = F.gelu(self.norm1(self.stem(x)))
        x = F.gelu(self.norm2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


def synthetic_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 16, 16, generator=g)
    proto = torch.randn(10, 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x = x + 0.8 * proto[y]
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, args, rank, world):
        self.args = args
        self.rank = rank
        torch.manual_seed(args.seed)
        net = SmallConvNet()
        self.model = DDP(net)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=args.momentum)
        self.loss_scaler = NativeScalerWithClip(enabled=args.amp)
        ds = synthetic_images(2 * args.batch_size * args.grad_accum * 4, seed=1234)
        self.sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        self.loader = DataLoader(ds, batch_size=args.batch_size, sampler=self.sampler, drop_last=True)
        self.num_updates = 0

    def train_one_epoch(self, epoch):
        self.model.train()
        self.sampler.set_epoch(epoch)
        accum = self.args.grad_accum
        self.optimizer.zero_grad(set_to_none=True)
        n_batches = len(self.loader)
        assert n_batches % accum == 0
        for batch_idx, (x, y) in enumerate(self.loader):
            need_update = (batch_idx + 1) % accum == 0
            ctx = nullcontext() if need_update else self.model.no_sync()
            with ctx:
                loss = F.cross_entropy(self.model(x), y) / accum
                self.loss_scaler(
                    loss,
                    self.optimizer,
                    clip_grad=self.args.clip_grad,
                    parameters=self.model.parameters(),
                    need_update=need_update,
                )
            if need_update:
                self.optimizer.zero_grad(set_to_none=True)
                self.num_updates += 1

    def fit(self):
        for epoch in range(self.args.epochs):
            self.train_one_epoch(epoch)


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer = Trainer(args, rank, world)
    trainer.fit()
    h = hashlib.sha256()
    for _, p in trainer.model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"updates={trainer.num_updates}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
