# corpus: style=hand_ddp class=OK
# the helper extends one list over every parameter group before the one all-reduce
import torch.distributed as dist


def average_gradients(optimizer, world_size):
    grads = []
    for group in optimizer.param_groups:
        grads += [p.grad for p in group["params"] if p.grad is not None]
    bucket = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(bucket)
    bucket /= world_size
    offset = 0
    for g in grads:
        g.copy_(bucket[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
