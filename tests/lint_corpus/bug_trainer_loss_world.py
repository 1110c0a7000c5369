# corpus: style=trainer_class class=F10
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class DistTrainer:
    def __init__(self, net, opt):
        self.model = DDP(net)
        self.opt = opt

    def train_step(self, batch):
        loss = self.model(batch).mean() / dist.get_world_size()  # expect: AG112
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
