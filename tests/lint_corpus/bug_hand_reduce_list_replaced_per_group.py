# corpus: style=hand_ddp class=F10
# the helper collects the gradients per parameter group but assigns the list anew on each
# pass: the all-reduce after the loop averages the last group only
import torch.distributed as dist


def average_gradients(optimizer, world_size):
    for group in optimizer.param_groups:
        grads = [p.grad for p in group["params"] if p.grad is not None]  # expect: AG320
    bucket = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(bucket)
    bucket /= world_size
    offset = 0
    for g in grads:
        g.copy_(bucket[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
