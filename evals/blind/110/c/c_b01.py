"""Fine-tune a small ResNet on 2 DDP ranks (torchrun) with frozen BatchNorm,
SGD + nesterov, OneCycleLR and gradient accumulation.
"""
import argparse
import hashlib
import math
import os
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4, help="per-rank micro-batch")
    p.add_argument("--accum-steps", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--num-train", type=int, default=96)
    p.add_argument("--seed", type=int, default=17)
    return p.parse_args()


# ----------------------------------------------------------------------------- model
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.short is None else self.short(x)))


class ResNetTiny(nn.Module):
    def __init__(self, num_classes=10, width=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def init_like_pretrained(model, seed):
    """Stand-in for loading ImageNet weights: random conv weights and non-trivial BN statistics."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=g))
            m.running_var.copy_(1.0 + 0.2 * torch.rand(m.num_features, generator=g))
            m.weight.data.copy_(1.0 + 0.1 * torch.randn(m.num_features, generator=g))
            m.bias.data.copy_(0.05 * torch.randn(m.num_features, generator=g))


def freeze_bn(model):
    # detection-style fine-tuning: BN layers keep the "pretrained" statistics and affine params
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
            m.weight.requires_grad_(False)
            m.bias.requires_grad_(False)


# ----------------------------------------------------------------------------- data
def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    proto = torch.randn(10, 3, 16, 16, generator=g)
    x = 0.6 * proto[y] + torch.randn(n, 3, 16, 16, generator=g)
    return TensorDataset(x, y)


# ----------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, args, model, train_set, rank, world):
        self.args, self.rank, self.world = args, rank, world
        self.model = model
        self.sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        self.loader = DataLoader(train_set, batch_size=args.batch_size, sampler=self.sampler, drop_last=True)
        decay, no_decay = [], []
        for n, p in model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim <= 1 else decay).append(p)
        self.optimizer = torch.optim.SGD(
            [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=args.lr, momentum=0.9, nesterov=True,
        )
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=args.lr, epochs=args.epochs,
            steps_per_epoch=len(self.loader), pct_start=0.25,
        )
        self.updates = 0

    def train_one_epoch(self, epoch):
        args = self.args
        self.model.train()
        freeze_bn(self.model)
        self.sampler.set_epoch(epoch)
        self.optimizer.zero_grad(set_to_none=True)
        for i, (images, target) in enumerate(self.loader):
            do_step = (i + 1) % args.accum_steps == 0
            ctx = nullcontext() if do_step else self.model.no_sync()
            with ctx:
                logits = self.model(images)
                loss = F.cross_entropy(logits, target) / args.accum_steps
                loss.backward()
            if do_step:
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.updates += 1
        if self.rank == 0:
            print(f"epoch {epoch} updates {self.updates} lr {self.scheduler.get_last_lr()[0]:.5f} loss {loss.item() * args.accum_steps:.4f}")


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.use_deterministic_algorithms(True)

    net = ResNetTiny()
    init_like_pretrained(net, args.seed)
    freeze_bn(net)
    model = DDP(net)
    trainer = Trainer(args, model, make_dataset(args.num_train, args.seed + 1), rank, world)
    for epoch in range(args.epochs):
        trainer.train_one_epoch(epoch)

    if rank == 0:
        print("FINAL_SHA256", params_sha256(model.module))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
