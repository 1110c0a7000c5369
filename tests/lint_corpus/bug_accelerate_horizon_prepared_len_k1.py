# corpus: style=accelerate class=F4
# no accumulation: the OneCycle/linear horizon is the prepared loader's length times the
# epochs (one process's steps) while the prepared scheduler advances num_processes per step
import torch
from accelerate import Accelerator
from torch.optim.lr_scheduler import LinearLR

accelerator = Accelerator(mixed_precision="fp16")
net, opt, dl = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), dl)
n_epochs = 5
decay = LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=n_epochs * len(dl))  # expect: AG125
decay = accelerator.prepare(decay)
for _ in range(n_epochs):
    for x, y in dl:
        accelerator.backward(torch.nn.functional.cross_entropy(net(x), y))
        opt.step()
        decay.step()
        opt.zero_grad()
