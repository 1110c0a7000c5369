# corpus: style=accelerate class=OK
# the runner stores the prepared optimizer back on self: accumulate() gates its step
import torch
from accelerate import Accelerator


class Runner:
    def __init__(self, model, loader, k=4):
        self.acc = Accelerator(gradient_accumulation_steps=k)
        self.net = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.loader = loader

    def prepare_all(self):
        net, opt, loader = self.acc.prepare(self.net, self.opt, self.loader)
        self.net, self.opt, self.loader = net, opt, loader

    def micro(self, x, y):
        with self.acc.accumulate(self.net):
            self.acc.backward(torch.nn.functional.mse_loss(self.net(x), y))
            self.opt.step()
            self.opt.zero_grad()

    def fit(self):
        self.prepare_all()
        for x, y in self.loader:
            self.micro(x, y)
