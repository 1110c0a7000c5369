# corpus: style=trainer_class class=OK
# the same bare temperature, its gradient averaged over the ranks by hand before its step
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ContrastiveTrainer:
    def __init__(self, model, rank):
        self.model = DDP(model)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.temp_opt = torch.optim.SGD([self.logit_scale], lr=0.5)

    def step(self, windows):
        for q, d in windows:
            zq, zd = self.model(q), self.model(d)
            logits = self.logit_scale.exp() * zq @ zd.t()
            loss = nn.functional.cross_entropy(logits, torch.arange(len(q))) / len(windows)
            loss.backward()
        dist.all_reduce(self.logit_scale.grad, op=dist.ReduceOp.AVG)
        self.opt.step()
        self.temp_opt.step()
        self.opt.zero_grad()
        self.temp_opt.zero_grad()
