# corpus: style=ddp class=OK
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(net, global_batches, criterion, accum=4):
    world_size = dist.get_world_size()
    ddp_net = DDP(net)
    opt = torch.optim.SGD(ddp_net.parameters(), lr=0.1)
    for big in global_batches:
        pieces = big.rank_slices(dist.get_rank(), world_size, accum)
        for n, (x, y) in enumerate(pieces):
            ddp_net.require_backward_grad_sync = n == len(pieces) - 1
            loss = criterion(ddp_net(x), y) / len(pieces)
            loss.backward()
        opt.step()
        opt.zero_grad()
