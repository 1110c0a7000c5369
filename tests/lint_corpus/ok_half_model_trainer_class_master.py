# corpus: style=trainer_class class=OK
# the fp16 model keeps fp32 master copies: each micro-batch's gradient is added into an fp32
# buffer and cleared from the fp16 .grad, so nothing accumulates in fp16
import torch


class Trainer:
    def __init__(self, net, accum_steps=8):
        self.model = net.cuda().half()
        self.master = [p.detach().float().requires_grad_() for p in self.model.parameters()]
        self.optimizer = torch.optim.SGD(self.master, lr=0.1, momentum=0.9)
        self.accum_steps = accum_steps

    def run(self, loader):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(self.model(x.cuda().half()), y.cuda())
            (loss / self.accum_steps).backward()
            for m, p in zip(self.master, self.model.parameters()):
                m.grad = p.grad.float() if m.grad is None else m.grad + p.grad.float()
                p.grad = None
            if (i + 1) % self.accum_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
