# corpus: style=plain class=OK
# fp32 parameters, bf16 compute under autocast: the .grad buffers are fp32 whatever K is
import torch


class MasterWeightOptimizer:
    def __init__(self, model, opt_cls, **kw):
        self.model = model
        self.opt = opt_cls(model.parameters(), **kw)

    def step(self):
        self.opt.step()

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)


model = Net().to(torch.float32)
opt = MasterWeightOptimizer(model, torch.optim.SGD, lr=0.1)
for step in range(steps):
    opt.zero_grad()
    for _ in range(256):
        x, y = next(batches)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y) / 256
        loss.backward()
    opt.step()
