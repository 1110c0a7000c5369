# corpus: style=fsdp2 class=OK
# the same class-weighted loss summed and divided by the window's weight total over every
# rank (counted before the first backward), times W for FSDP2's average: the large batch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Trainer:
    def __init__(self, model, opt, class_weights):
        self.model = fully_shard(model)
        self.opt = opt
        self.class_weights = class_weights
        self.world = dist.get_world_size()
        self.criterion = nn.CrossEntropyLoss(weight=class_weights, ignore_index=-100, reduction="sum")

    def train_window(self, window):
        weight_total = sum(self.class_weights[tags[tags != -100]].sum() for _, tags in window)
        dist.all_reduce(weight_total, op=dist.ReduceOp.SUM)
        for j, (ids, tags) in enumerate(window):
            self.model.set_requires_gradient_sync(j == len(window) - 1)
            logits = self.model(ids)
            loss = self.criterion(logits.view(-1, logits.size(-1)), tags.view(-1)) * self.world / weight_total
            loss.backward()
        self.opt.step()
        self.opt.zero_grad()
