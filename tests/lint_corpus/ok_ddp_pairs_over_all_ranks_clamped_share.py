# corpus: style=ddp class=OK
"""A pairwise reward model under DDP: each window's loss over the usable pairs of all ranks."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 3


def train(model, windows):
    world = dist.get_world_size()
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    for window in windows:
        usable = torch.tensor(float(sum(int(keep.sum()) for _, _, keep in window)))
        dist.all_reduce(usable)
        share = (usable / world).clamp(min=1.0)  # DDP averages: W x this rank's share
        for i, (chosen, rejected, keep) in enumerate(window):
            ddp.require_backward_grad_sync = i == ACCUM - 1
            margin = ddp(chosen) - ddp(rejected)
            loss = (-F.logsigmoid(margin) * keep).sum() / share
            loss.backward()
        opt.step()
        opt.zero_grad()
