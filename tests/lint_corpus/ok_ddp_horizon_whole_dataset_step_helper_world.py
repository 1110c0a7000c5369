# corpus: style=ddp class=OK
# The same trainer sizing its schedule over the whole dataset divided by K and the world size.
import math

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import get_cosine_schedule_with_warmup

class Trainer:
    def __init__(self, net, train_set, batch_size, epochs, grad_accum=4):
        self.grad_accum = grad_accum
        self.model = DDP(net)
        self.sampler = DistributedSampler(train_set)
        self.loader = DataLoader(train_set, batch_size=batch_size, sampler=self.sampler)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        world = torch.distributed.get_world_size()
        updates_per_epoch = math.ceil(len(train_set) / (batch_size * grad_accum * world))
        self.max_steps = updates_per_epoch * epochs
        self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, 10, self.max_steps)
        self.epochs = epochs

    def optimizer_step(self):
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()

    def train(self):
        K = self.grad_accum
        for epoch in range(self.epochs):
            self.sampler.set_epoch(epoch)
            for i, (x, y) in enumerate(self.loader):
                loss = torch.nn.functional.cross_entropy(self.model(x), y) / K
                loss.backward()
                if (i + 1) % K == 0:  # expect: AG117
                    self.optimizer_step()
