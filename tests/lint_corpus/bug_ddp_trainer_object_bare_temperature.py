# corpus: style=trainer_class class=F10
# a CLIP temperature kept as a bare nn.Parameter on a (plain) trainer object, stepped by its
# own optimizer: DDP averages the wrapped model's gradients only
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ContrastiveTrainer:
    def __init__(self, model, rank):
        self.model = DDP(model)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.temp_opt = torch.optim.SGD([self.logit_scale], lr=0.5)  # expect: AG180

    def step(self, windows):
        for q, d in windows:
            zq, zd = self.model(q), self.model(d)
            logits = self.logit_scale.exp() * zq @ zd.t()
            loss = nn.functional.cross_entropy(logits, torch.arange(len(q))) / len(windows)
            loss.backward()
        self.opt.step()
        self.temp_opt.step()
        self.opt.zero_grad()
        self.temp_opt.zero_grad()
