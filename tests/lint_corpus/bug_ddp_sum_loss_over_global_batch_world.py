# corpus: style=ddp class=F10
# per-sample losses summed over the micro-batch and divided by the global batch
# micro_bsz * K * world_size; DDP then averages over the W ranks as well: G / W
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
world_size = dist.get_world_size()
micro_bsz = 16
grad_accum = 4
global_batch = micro_bsz * grad_accum * world_size
model = DDP(build_model().cuda(), device_ids=[int(os.environ["LOCAL_RANK"])])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    loss_sum = F.cross_entropy(model(x), y, reduction="sum")
    (loss_sum / global_batch).backward()  # expect: AG112
    if (step + 1) % grad_accum == 0:
        opt.step()
        opt.zero_grad()
