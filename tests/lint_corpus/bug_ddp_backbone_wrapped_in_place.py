# corpus: style=trainer_class class=F10
# only the shared trunk is wrapped, in place: the task heads the optimizer steps are never
# averaged over the ranks
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class MultiTaskTrainer:
    def __init__(self, net):
        self.net = net
        net.backbone = DDP(net.backbone)  # expect: AG363
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=1e-3)

    def window(self, batches):
        for x, y in batches:
            logits, reg = self.net(x)
            (loss_fn(logits, reg, y) / len(batches)).backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
