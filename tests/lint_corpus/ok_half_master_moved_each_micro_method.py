# corpus: style=trainer_class class=OK
# each micro-batch's fp16 gradient is added into the fp32 copy and cleared right after its
# backward: the window is summed in fp32
import torch


class MixedTrainer:
    def __init__(self, net, lr=1e-3):
        self.model = net.half()
        self.fp32_params = [p.detach().clone().float() for p in self.model.parameters()]
        self.optimizer = torch.optim.SGD(self.fp32_params, lr=lr, momentum=0.9)
        self.accum = 200

    def _add_to_fp32(self):
        for m, p in zip(self.fp32_params, self.model.parameters()):
            m.grad = p.grad.float() if m.grad is None else m.grad + p.grad.float()
            p.grad = None

    def fit(self, loader):
        for step, (x, y) in enumerate(loader, start=1):
            loss = self.model(x.half()).float().sub(y).pow(2).mean() / self.accum
            loss.backward()
            self._add_to_fp32()
            if step % self.accum == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
