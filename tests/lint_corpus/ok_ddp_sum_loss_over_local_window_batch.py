# corpus: style=ddp class=OK
# the summed loss divided by this rank's window batch micro_bsz * K (equal on every rank);
# DDP's average over the W ranks completes the global mean
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
micro_bsz = 16
grad_accum = 4
window_batch = micro_bsz * grad_accum
model = DDP(build_model().cuda(), device_ids=[int(os.environ["LOCAL_RANK"])])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    loss_sum = F.cross_entropy(model(x), y, reduction="sum")
    (loss_sum / window_batch).backward()
    if (step + 1) % grad_accum == 0:
        opt.step()
        opt.zero_grad()
