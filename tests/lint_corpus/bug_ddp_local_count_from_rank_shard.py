# corpus: style=ddp class=F6
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

ACC_STEPS = 4


def main(build, corpus, epochs=1):
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(build())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    shard = corpus.split_for(rank, world_size)
    for start in range(0, len(shard), ACC_STEPS):
        window = shard[start:start + ACC_STEPS]
        tokens_seen = sum(int((lab != -100).sum()) for _, lab in window)
        for j, (tok, lab) in enumerate(window):
            model.require_backward_grad_sync = j == len(window) - 1
            out = model(tok)
            loss_total = F.cross_entropy(out.flatten(0, 1), lab.flatten(), ignore_index=-100, reduction="sum")
            (loss_total / tokens_seen).backward()  # expect: AG113
        optimizer.step()
        optimizer.zero_grad()
