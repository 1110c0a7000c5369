"""Multi-task scene model (classification + coarse depth) on 2 DDP ranks.
A frozen stem, BatchNorm in the trunk, and an accumulation-aware optimizer
wrapper that owns the K-step window (it steps and clears every K calls)."""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler

GRAD_ACCUM = 2
EPOCHS = 2
BATCH = 6
DEPTH_WEIGHT = 0.5


class GradAccumOptimizer:
    """Wraps an optimizer so the training loop can call .step() on every
    micro-batch; the real step (and clear) happens on every K-th call."""

    def __init__(self, optimizer, accum_steps):
        self.optimizer = optimizer
        self.accum_steps = accum_steps
        self._calls = 0

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def will_step(self):
        return (self._calls + 1) % self.accum_steps == 0

    def step(self):
        self._calls += 1
        if self._calls % self.accum_steps == 0:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return True
        return False


class SceneNet(nn.Module):
    def __init__(self, n_classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)  # "pretrained", frozen
        self.block = nn.Sequential(
            nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        )
        self.cls_head = nn.Linear(16, n_classes)
        self.depth_head = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        h = self.block(F.relu(self.stem(x)))
        return self.cls_head(h.mean(dim=(2, 3))), self.depth_head(h)


def build_dataset(n=192, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 12, 12, generator=g)
    y = (x[:, 0].mean(dim=(1, 2)) * 4).long().clamp(-2, 2) + 2
    depth = F.avg_pool2d(x[:, 1:2], 2) + 0.1 * torch.randn(n, 1, 6, 6, generator=g)
    return TensorDataset(x, y, depth)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    net = SceneNet()
    net.stem.requires_grad_(False)
    model = DDP(net)
    base_opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                               lr=0.05, momentum=0.9, nesterov=True)
    optimizer = GradAccumOptimizer(base_opt, GRAD_ACCUM)

    ds = build_dataset()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=1)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        for i, (x, y, depth) in enumerate(loader):
            ctx = nullcontext() if optimizer.will_step() else model.no_sync()
            with ctx:
                logits, depth_pred = model(x)
                loss = F.cross_entropy(logits, y) + DEPTH_WEIGHT * F.smooth_l1_loss(depth_pred, depth)
                (loss / GRAD_ACCUM).backward()
            if (i + 1) % GRAD_ACCUM == 0:
                optimizer.step()

    if rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
