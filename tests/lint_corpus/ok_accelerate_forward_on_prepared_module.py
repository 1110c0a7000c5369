# corpus: style=accelerate class=OK
# the forward runs on the prepared model: its DDP reduces the window
import torch
from accelerate import Accelerator


def train(net, loader, k=4):
    acc = Accelerator(gradient_accumulation_steps=k)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    ddp_net, opt, loader = acc.prepare(net, opt, loader)
    for x, y in loader:
        with acc.accumulate(ddp_net):
            loss = torch.nn.functional.cross_entropy(ddp_net(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
