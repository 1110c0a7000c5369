# corpus: style=trainer_class class=OK
# A trainer class whose no_sync is entered after the forward (around backward only):
# DDP already armed the reduction at the forward, so every micro-step syncs. Correct.
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, net, loader, accumulation_steps=8):
        self.model = DDP(net)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.scaler = torch.amp.GradScaler()
        self.loader = loader
        self.accumulation_steps = accumulation_steps

    def fit(self):
        micro = 0
        data = iter(self.loader)
        while True:
            try:
                x, y = next(data)
            except StopIteration:
                break
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(self.model(x), y)
            micro += 1
            if micro % self.accumulation_steps:
                with self.model.no_sync():  # expect: AG116
                    self.scaler.scale(loss / self.accumulation_steps).backward()
                continue
            self.scaler.scale(loss / self.accumulation_steps).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad(set_to_none=True)
