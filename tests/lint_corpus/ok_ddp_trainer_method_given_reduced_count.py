# corpus: style=trainer_class class=OK
# the count is all-reduced (and divided by W for DDP's average) before the micro-steps
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
        loss = err.sum() / n_valid
        loss.backward()

    def fit(self, windows):
        for window in windows:
            n_valid = sum(b["mask"].sum() for b in window)
            dist.all_reduce(n_valid)
            n_valid = n_valid / dist.get_world_size()
            for b in window:
                self.micro(b, n_valid)
            self.opt.step()
            self.opt.zero_grad()
