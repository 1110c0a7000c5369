# corpus: style=ddp class=F10
"""Contrastive image-text training under DDP; the InfoNCE loss module learns its temperature."""
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

K = 2


class Towers(nn.Module):
    def __init__(self):
        super().__init__()
        self.img = nn.Linear(32, 16)
        self.txt = nn.Linear(24, 16)

    def forward(self, a, b):
        return F.normalize(self.img(a), dim=-1), F.normalize(self.txt(b), dim=-1)


class InfoNCE(nn.Module):
    def __init__(self, temperature=0.07):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)))

    def forward(self, u, v):
        logits = self.log_scale.exp() * u @ v.t()
        target = torch.arange(u.shape[0])
        return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = DistributedDataParallel(Towers())
    loss_fn = InfoNCE()
    opt = torch.optim.AdamW([*net.parameters(), *loss_fn.parameters()], lr=1e-3)  # expect: AG180
    for step in range(20):
        for micro in range(K):
            a, b = torch.randn(8, 32), torch.randn(8, 24)
            with net.no_sync() if micro < K - 1 else torch.enable_grad():
                (loss_fn(*net(a, b)) / K).backward()
        opt.step()
        opt.zero_grad()
    if int(os.environ["RANK"]) == 0:
        print("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
