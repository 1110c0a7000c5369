# corpus: style=ddp class=OK
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, windows, opt):
    ddp = DDP(model)
    for window in windows:
        for i, (x, y) in enumerate(window):
            is_sync_step = i + 1 == len(window)
            # the window's earlier micro-steps bypass DDP (no reduction); the last one
            # runs through it and DDP reduces the accumulated .grad, as no_sync() would
            net = ddp if is_sync_step else ddp.module
            loss = F.mse_loss(net(x), y) / len(window)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
