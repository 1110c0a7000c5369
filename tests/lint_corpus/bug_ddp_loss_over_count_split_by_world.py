# corpus: style=ddp class=F10
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Runner:
    def __init__(self, model, loader, opt, global_batch=64, micro=4):
        self.model = DDP(model)
        self.loader, self.opt = loader, opt
        self.total_micro = global_batch // micro
        self.per_rank = self.total_micro // dist.get_world_size()

    def run(self):
        for i, (x, y) in enumerate(self.loader):
            loss = F.mse_loss(self.model(x), y) / self.total_micro  # expect: AG112
            loss.backward()
            if (i + 1) % self.per_rank == 0:
                self.opt.step()
                self.opt.zero_grad()
