"""DDP trainer class, ranks with different micro-batch sizes, bf16 autocast.

Rank 0 draws 3 samples per micro-batch, rank 1 draws 5.  Each window of K
micro-batches is weighted per sample: the summed loss is divided by the
window's sample count over all ranks and multiplied by the world size (DDP
averages).  Backbone on AdamW, classifier on SGD; the sync is skipped inside
the window with no_sync() around forward and backward.
"""
import argparse
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--updates", type=int, default=12)
    p.add_argument("--seed", type=int, default=8)
    return p.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.classifier = nn.Linear(48, 5)

    def forward(self, x):
        return self.classifier(self.backbone(x))


class UnevenDDPTrainer:
    def __init__(self, args):
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.K, self.updates = args.grad_accum, args.updates
        torch.manual_seed(args.seed)
        self.ddp = DDP(Net())
        net = self.ddp.module
        self.opts = [torch.optim.AdamW(net.backbone.parameters(), lr=2e-3),
                     torch.optim.SGD(net.classifier.parameters(), lr=0.05, momentum=0.9)]
        self.bs = 3 + 2 * self.rank
        g = torch.Generator().manual_seed(args.seed + 50 * self.rank)
        n = self.updates * self.K
        self.x = torch.randn(n, self.bs, 16, generator=g)
        self.y = torch.randint(0, 5, (n, self.bs), generator=g)

    def global_count(self, n_local):
        t = torch.tensor([float(n_local)])
        dist.all_reduce(t)
        return t.item()

    def forward_backward(self, i, denom, sync):
        ctx = contextlib.nullcontext() if sync else self.ddp.no_sync()
        with ctx:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = self.ddp(self.x[i])
            loss = F.cross_entropy(logits.float(), self.y[i], reduction="sum")
            (loss * self.world / denom).backward()
        return loss.item()

    def update(self):
        for o in self.opts:
            o.step()
        for o in self.opts:
            o.zero_grad(set_to_none=True)

    def train(self):
        for u in range(self.updates):
            idx = range(u * self.K, (u + 1) * self.K)
            denom = self.global_count(self.bs * self.K)
            for j, i in enumerate(idx):
                self.forward_backward(i, denom, sync=(j == self.K - 1))
            self.update()

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.ddp.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    t = UnevenDDPTrainer(get_args())
    t.train()
    s = t.sha()
    if t.rank == 0:
        print(f"FINAL_SHA256 {s}")
    dist.destroy_process_group()
