# corpus: style=fsdp2 class=OK
# the world size is known only as the number of processes given to init_process_group
# (`args.nproc`, unpacked as W): the all-reduced window count is divided by W, its rank share,
# so FSDP's average over ranks gives the large batch's mean
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo", rank=rank, world_size=args.nproc)
K, W = args.accum, args.nproc
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
for step in range(args.steps):
    window = [data[(step * K + j) * W + rank] for j in range(K)]
    n_targets = count_targets(window)
    dist.all_reduce(n_targets)
    n_targets = n_targets / W
    for j, (ids, labels) in enumerate(window):
        model.set_requires_gradient_sync(j == K - 1)
        loss = token_loss_sum(model, ids, labels) / n_targets
        loss.backward()
    opt.step()
    opt.zero_grad()
