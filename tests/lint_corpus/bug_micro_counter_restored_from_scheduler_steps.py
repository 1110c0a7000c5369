# corpus: style=class_trainer class=F13
# the micro-step counter restored from the scheduler's count of optimizer steps
import torch


class Trainer:
    def __init__(self, model, k):
        self.model, self.k, self.micro = model, k, 0
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / 10))

    def train_batch(self, x, y):
        loss = torch.nn.functional.cross_entropy(self.model(x), y) / self.k
        loss.backward()
        if (self.micro + 1) % self.k == 0:
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()
        self.micro += 1

    def load(self, path):
        ck = torch.load(path)
        self.opt.load_state_dict(ck["opt"])
        self.sched.load_state_dict(ck["sched"])
        self.micro = self.sched.last_epoch  # expect: AG332

    def run(self, xs, ys):
        while self.micro < len(xs):
            self.train_batch(xs[self.micro], ys[self.micro])
