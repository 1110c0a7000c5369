# corpus: style=trainer_class class=OK
# checkpoints every 5 micro-batches (inside windows too), and the resume rounds the counter down
# to its window's start, so the interrupted window is replayed whole
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Config:
    accum: int = 4
    save_every: int = 5


class Trainer:
    def __init__(self, model, cfg):
        self.cfg = cfg
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        self.micro_step = 0

    def save(self, path):
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                    "micro_step": self.micro_step}, path)

    def resume(self, path):
        ck = torch.load(path)
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.micro_step = ck["micro_step"] - ck["micro_step"] % self.cfg.accum

    def train(self, batches, path):
        for x, y in batches[self.micro_step:]:
            (F.cross_entropy(self.model(x), y) / self.cfg.accum).backward()
            self.micro_step += 1
            if self.micro_step % self.cfg.accum == 0:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            if self.micro_step % self.cfg.save_every == 0:
                self.save(path)


trainer = Trainer(model, Config())
trainer.resume("last.pt")
trainer.train(batches, "last.pt")
