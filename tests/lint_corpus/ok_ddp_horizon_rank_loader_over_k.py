# corpus: style=ddp class=OK
"""The fixed twin of bug_ddp_horizon_rank_loader_over_world: the rank's loader length over K
is the optimizer steps each rank makes (blind round 126 a_b03 fixed)."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from transformers import get_cosine_schedule_with_warmup


class Trainer:
    def __init__(self, model, dataset, k, epochs):
        self.world_size = dist.get_world_size()
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=8, sampler=self.sampler)
        self.k = k
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        total = epochs * len(self.loader) // self.k
        self.sched = get_cosine_schedule_with_warmup(self.opt, 2, total)
        self.model = model

    def epoch(self):
        for i, (x, y) in enumerate(self.loader):
            (torch.nn.functional.mse_loss(self.model(x), y) / self.k).backward()
            if (i + 1) % self.k == 0:
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad()
        self.opt.zero_grad()  # the epoch's leftover is dropped
