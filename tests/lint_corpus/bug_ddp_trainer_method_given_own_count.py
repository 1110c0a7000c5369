# corpus: style=trainer_class class=F6
# the window's count is made from this rank's micro-batches and handed to the micro-step
# method: under DDP's average each rank's window is its own mean
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, net, k=4):
        self.ddp = DDP(net)
        self.k = k
        self.opt = torch.optim.AdamW(self.ddp.parameters(), lr=1e-4)

    def micro(self, batch, n_valid):
        err = (self.ddp(batch["x"]) - batch["y"]).pow(2) * batch["mask"]
        loss = err.sum() / n_valid  # expect: AG113
        loss.backward()

    def fit(self, windows):
        for window in windows:
            n_valid = sum(b["mask"].sum() for b in window)
            for b in window:
                self.micro(b, n_valid)
            self.opt.step()
            self.opt.zero_grad()
