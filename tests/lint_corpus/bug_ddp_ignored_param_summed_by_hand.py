# corpus: style=ddp class=F10
"""DDP over a VQ autoencoder; the codebook is kept out of DDP and reduced by hand."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 2


def sync_codebook(net):
    cb_grad = net.codebook.grad
    dist.all_reduce(cb_grad, op=dist.ReduceOp.SUM)  # expect: AG107


def train(net, batches):
    DDP._set_params_and_buffers_to_ignore_for_model(net, ["codebook"])
    ddp = DDP(net)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    for i, x in enumerate(batches):
        (F.mse_loss(ddp(x), x) / ACCUM).backward()
        if (i + 1) % ACCUM == 0:
            sync_codebook(net)
            opt.step()
            opt.zero_grad()
