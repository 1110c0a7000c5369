"""Transfer learning of a small ResNet on 2 DDP ranks (torchrun).

- BatchNorm frozen (eval mode, affine frozen) and the stem frozen;
- the backbone trained with SGD, the new classifier head with AdamW, one LambdaLR each;
- fp16 autocast with one GradScaler shared by both optimizers, unscale then clip at the boundary;
- 7 micro-batches per epoch per rank and 3 per window: windows of 3, 3, 1, each
  normalised by its own length;
- the run is interrupted after 2 epochs, checkpointed, and resumed into fresh objects.
"""
import hashlib
import io
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED = 23
ACCUM = 3
MICRO_BS = 4
EPOCHS = 5
STOP_AFTER_EPOCH = 2
CLIP = 0.5


def conv_bn(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a = conv_bn(c, c)
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return F.relu(x + self.b(self.a(x)))


class Net(nn.Module):
    def __init__(self, n_cls=6, w=8):
        super().__init__()
        self.stem = conv_bn(3, w)
        self.stage1 = Residual(w)
        self.down = conv_bn(w, 2 * w, stride=2)
        self.stage2 = Residual(2 * w)
        self.head = nn.Linear(2 * w, n_cls)

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def set_frozen_bn(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)


def build_dataset():
    g = torch.Generator().manual_seed(SEED)
    n = 56
    y = torch.randint(0, 6, (n,), generator=g)
    centers = torch.randn(6, 3, 12, 12, generator=g)
    x = 0.7 * centers[y] + torch.randn(n, 3, 12, 12, generator=g)
    return TensorDataset(x, y)


class FineTuner:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(SEED)
        net = Net()
        g = torch.Generator().manual_seed(SEED + 100)
        for m in net.modules():  # "pretrained" statistics
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1, generator=g)
                m.running_var.uniform_(0.8, 1.2, generator=g)
        set_frozen_bn(net)
        for p in net.stem.parameters():
            p.requires_grad_(False)
        self.net = net
        self.model = DDP(net)
        backbone = [p for n, p in net.named_parameters() if p.requires_grad and not n.startswith("head.")]
        self.opt_backbone = torch.optim.SGD(backbone, lr=0.02, momentum=0.9, weight_decay=1e-4)
        self.opt_head = torch.optim.AdamW(net.head.parameters(), lr=3e-3, weight_decay=0.01)
        self.optimizers = [self.opt_backbone, self.opt_head]
        total = EPOCHS * math.ceil(7 / ACCUM)
        warm = 3
        fn = lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, fn) for o in self.optimizers]
        self.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        ds = build_dataset()
        self.sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
        self.loader = DataLoader(ds, batch_size=MICRO_BS, sampler=self.sampler)
        self.epoch = 0
        self.step_count = 0

    def state_dict(self):
        return {
            "model": self.net.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "step_count": self.step_count,
        }

    def load_state_dict(self, sd):
        self.net.load_state_dict(sd["model"])
        for o, s in zip(self.optimizers, sd["optimizers"]):
            o.load_state_dict(s)
        for sch, s in zip(self.schedulers, sd["schedulers"]):
            sch.load_state_dict(s)
        self.scaler.load_state_dict(sd["scaler"])
        self.epoch = sd["epoch"]
        self.step_count = sd["step_count"]

    def _update(self):
        for o in self.optimizers:
            self.scaler.unscale_(o)
        torch.nn.utils.clip_grad_norm_([p for p in self.net.parameters() if p.requires_grad], CLIP)
        for o in self.optimizers:
            self.scaler.step(o)
        self.scaler.update()
        for s in self.schedulers:
            s.step()
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)
        self.step_count += 1

    def run_epoch(self):
        self.model.train()
        set_frozen_bn(self.net)
        self.sampler.set_epoch(self.epoch)
        n = len(self.loader)
        for i, (x, y) in enumerate(self.loader):
            w_start = (i // ACCUM) * ACCUM
            w_len = min(ACCUM, n - w_start)
            boundary = (i + 1 == w_start + w_len)
            with (nullcontext() if boundary else self.model.no_sync()):
                with torch.autocast("cpu", dtype=torch.float16):
                    logits = self.model(x)
                loss = F.cross_entropy(logits.float(), y) / w_len
                self.scaler.scale(loss).backward()
            if boundary:
                self._update()
        self.epoch += 1


def sha_of(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    ft = FineTuner(rank, world)
    while ft.epoch < STOP_AFTER_EPOCH:
        ft.run_epoch()
    buf = io.BytesIO()
    torch.save(ft.state_dict(), buf)
    if rank == 0:
        print(f"interrupted after epoch {ft.epoch}, {ft.step_count} updates; resuming")
    del ft

    ft = FineTuner(rank, world)
    buf.seek(0)
    ft.load_state_dict(torch.load(buf, weights_only=False))
    while ft.epoch < EPOCHS:
        ft.run_epoch()
    if rank == 0:
        print(f"done: {ft.step_count} updates, scale {ft.scaler.get_scale()}")
        print("FINAL_SHA256", sha_of(ft.net))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
