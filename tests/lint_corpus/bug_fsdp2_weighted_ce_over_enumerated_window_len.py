# corpus: style=fsdp2 class=F5
# a class-weighted, ignore_index cross-entropy (a mean over this micro-batch's own weight
# total) divided by len(window) inside `for j, mb in enumerate(window)`: K per-micro-batch means
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Trainer:
    def __init__(self, model, opt, class_weights):
        self.model = fully_shard(model)
        self.opt = opt
        self.criterion = nn.CrossEntropyLoss(weight=class_weights, ignore_index=-100)

    def train_window(self, window):
        for j, (ids, tags) in enumerate(window):
            self.model.set_requires_gradient_sync(j == len(window) - 1)
            logits = self.model(ids)
            loss = self.criterion(logits.view(-1, logits.size(-1)), tags.view(-1)) / len(window)  # expect: AG104
            loss.backward()
        self.opt.step()
        self.opt.zero_grad()
