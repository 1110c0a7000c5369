# corpus: style=trainer_class class=F12
import torch


class LongAccumTrainer:
    def __init__(self, net_cls):
        self.micro_steps = 160
        self.model = net_cls().to(dtype=torch.bfloat16)  # expect: AG120
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4)

    def update(self, batches):
        for _ in range(self.micro_steps):
            src, dst = next(batches)
            err = (self.model(src.bfloat16()).float() - dst).square().mean()
            (err / self.micro_steps).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
