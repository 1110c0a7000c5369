# corpus: style=accelerate class=F1
# a runner class prepares its objects but keeps the raw optimizer on self: inside
# accumulate() the raw optimizer is not gated, so it steps on every micro-batch
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
        self.net, self.loader = net, loader

    def micro(self, x, y):
        with self.acc.accumulate(self.net):
            self.acc.backward(torch.nn.functional.mse_loss(self.net(x), y))
            self.opt.step()  # expect: AG101
            self.opt.zero_grad()

    def fit(self):
        self.prepare_all()
        for x, y in self.loader:
            self.micro(x, y)
