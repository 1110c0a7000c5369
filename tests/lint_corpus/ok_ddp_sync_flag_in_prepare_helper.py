# corpus: style=trainer_class class=OK
# the trainer sets DDP's sync flag in a helper the loop calls before the helper that runs
# the forward: the window's last forward arms the all-reduce of its backward
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Runner:
    def __init__(self, net, opt, accum):
        self.net, self.opt, self.accum = DDP(net), opt, accum

    def prepare(self, i):
        self.net.require_backward_grad_sync = i + 1 == self.accum

    def forward_loss(self, batch):
        return torch.nn.functional.cross_entropy(self.net(batch["x"]), batch["y"])

    def step(self, batches):
        for i in range(self.accum):
            self.prepare(i)
            loss = self.forward_loss(batches[i])
            (loss / self.accum).backward()
        self.opt.step()
        self.opt.zero_grad()
