# corpus: style=accelerate class=F10
# the prepared (DDP) model is bound to `ddp_net`, but the loop keeps calling `net`: DDP's
# forward never runs, so no backward is reduced over the processes
import torch
from accelerate import Accelerator


def train(net, loader, k=4):
    acc = Accelerator(gradient_accumulation_steps=k)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    ddp_net, opt, loader = acc.prepare(net, opt, loader)
    for x, y in loader:
        with acc.accumulate(ddp_net):
            loss = torch.nn.functional.cross_entropy(net(x), y)  # expect: AG189
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
