# corpus: style=trainer_class class=F13
# fault tolerance: a checkpoint every 6 micro-batches while the optimizer steps every 4; the
# checkpoint has no gradient, and resume restores the micro-batch counter as saved, so a run
# resumed from micro-batch 6 steps on micro-batches 7-8 of that window only
import argparse

import torch
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--ckpt-every", type=int, default=6)
    p.add_argument("--resume", default="")
    return p.parse_args()


class Checkpointer:
    def __init__(self, path, every):
        self.path = path
        self.every = every

    def maybe_save(self, trainer, micro):
        if micro % self.every == 0:  # expect: AG150
            trainer.save(self.path)


class Trainer:
    def __init__(self, model, args):
        self.model = model
        self.accum = args.grad_accum
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.micro = 0

    def save(self, path):
        state = {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "micro": self.micro}
        torch.save(state, path)

    def load(self, path):
        ck = torch.load(path)
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optim"])
        self.micro = ck["micro"]

    def fit(self, loader, ckpt):
        for x, y in loader:
            loss = F.cross_entropy(self.model(x), y) / self.accum
            loss.backward()
            self.micro += 1
            if self.micro % self.accum == 0:
                self.opt.step()
                self.opt.zero_grad()
            ckpt.maybe_save(self, self.micro)


args = parse()
trainer = Trainer(model, args)
if args.resume:
    trainer.load(args.resume)
trainer.fit(loader, Checkpointer("last.pt", args.ckpt_every))
