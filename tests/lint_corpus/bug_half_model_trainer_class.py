# corpus: style=trainer_class class=F12
# a trainer class runs the model in fp16 (`.half()`) and accumulates 8 micro-batches into fp16 .grad
import torch


class Trainer:
    def __init__(self, net, accum_steps=8):
        self.model = net.cuda().half()  # expect: AG120
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.accum_steps = accum_steps

    def run(self, loader):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(self.model(x.cuda().half()), y.cuda())
            (loss / self.accum_steps).backward()
            if (i + 1) % self.accum_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
