# corpus: style=trainer_class class=OK
import torch


class LongAccumTrainer:
    def __init__(self, net_cls):
        self.micro_steps = 160
        self.model = net_cls().to(dtype=torch.bfloat16)
        self.master = [p.detach().float().requires_grad_() for p in self.model.parameters()]
        self.opt = torch.optim.AdamW(self.master, lr=3e-4)

    def update(self, batches):
        for _ in range(self.micro_steps):
            src, dst = next(batches)
            err = (self.model(src.bfloat16()).float() - dst).square().mean()
            (err / self.micro_steps).backward()
            for m, p in zip(self.master, self.model.parameters()):
                m.grad = p.grad.float() if m.grad is None else m.grad + p.grad.float()
                p.grad = None
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
