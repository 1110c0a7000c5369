# corpus: style=trainer_class class=OK
# the whole multi-task network wrapped: DDP averages the trunk and the heads
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class MultiTaskTrainer:
    def __init__(self, net):
        self.net = net
        self.model = DDP(net, find_unused_parameters=True)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=1e-3)

    def window(self, batches):
        for x, y in batches:
            logits, reg = self.model(x)
            (loss_fn(logits, reg, y) / len(batches)).backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
