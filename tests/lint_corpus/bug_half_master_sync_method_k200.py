# corpus: style=trainer_class class=F12
import torch


class MixedTrainer:
    def __init__(self, net, lr=1e-3):
        self.model = net.half()  # expect: AG120
        self.fp32_params = [p.detach().clone().float() for p in self.model.parameters()]
        self.optimizer = torch.optim.SGD(self.fp32_params, lr=lr, momentum=0.9)
        self.accum = 200

    def _sync_to_fp32(self):
        for m, p in zip(self.fp32_params, self.model.parameters()):
            m.grad = p.grad.float()
            p.grad = None

    def fit(self, loader):
        for step, (x, y) in enumerate(loader, start=1):
            loss = self.model(x.half()).float().sub(y).pow(2).mean() / self.accum
            loss.backward()
            if step % self.accum == 0:
                self._sync_to_fp32()
                self.optimizer.step()
                self.optimizer.zero_grad()
