# corpus: style=trainer_class class=F3
"""A trainer class: `fit` runs `train_step` per micro-batch; a probe runs every few batches."""
import torch
import torch.nn.functional as F

ACCUM = 4
PROBE_EVERY = 10


class Trainer:
    def __init__(self, model):
        self.model = model
        self.accum = ACCUM
        self.probe_every = PROBE_EVERY
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.micro = 0

    def train_step(self, x, y):
        (F.cross_entropy(self.model(x), y) / self.accum).backward()
        self.micro += 1
        if self.micro % self.accum == 0:
            self.opt.step()
            self.opt.zero_grad()
        if self.micro % self.probe_every == 0:
            self.probe(x)

    def probe(self, x):
        self.model.zero_grad()  # expect: AG102
        with torch.no_grad():
            print("activation norm", self.model(x).norm().item())

    def fit(self, loader):
        for x, y in loader:
            self.train_step(x, y)
