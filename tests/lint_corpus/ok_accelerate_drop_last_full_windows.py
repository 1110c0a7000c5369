# corpus: style=accelerate class=OK
# 53 rows in batches of 5 with drop_last: 10 batches a pass (5 on each of 2 processes), K = 5
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(gradient_accumulation_steps=5)
net = torch.nn.Linear(6, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
data = TensorDataset(torch.randn(53, 6), torch.randn(53, 1))
loader = DataLoader(data, batch_size=5, drop_last=True)
net, opt, loader = accelerator.prepare(net, opt, loader)
for x, y in loader:
    with accelerator.accumulate(net):
        accelerator.backward(torch.nn.functional.mse_loss(net(x), y))
        opt.step()
        opt.zero_grad()
