# corpus: style=trainer_class class=F11
# the trainer sets DDP's sync flag in its backward helper, which the loop calls after the
# helper that runs the forward: the flag decides the next micro-step, so the window's last
# backward is never all-reduced
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Runner:
    def __init__(self, net, opt, accum):
        self.net, self.opt, self.accum = DDP(net), opt, accum

    def forward_loss(self, batch):
        return torch.nn.functional.cross_entropy(self.net(batch["x"]), batch["y"])

    def backward(self, loss, i):
        self.net.require_backward_grad_sync = i + 1 == self.accum  # expect: AG106
        (loss / self.accum).backward()

    def step(self, batches):
        for i in range(self.accum):
            loss = self.forward_loss(batches[i])
            self.backward(loss, i)
        self.opt.step()
        self.opt.zero_grad()
