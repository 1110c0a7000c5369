# corpus: style=fsdp2 class=F10
# summing over ranks (the loss is normalised by the window's global token count): the divide
# factor is set on the root only, so the blocks' units still average over the ranks
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = build_model()
for blk in model.blocks:
    fully_shard(blk)
fully_shard(model)
model.set_gradient_divide_factor(1.0)  # expect: AG156
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for window in windows:
    n = torch.tensor(float(sum((y != -100).sum() for _, y in window)))
    dist.all_reduce(n)
    for i, (x, y) in enumerate(window):
        model.set_requires_gradient_sync(i == len(window) - 1)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum") / n
        loss.backward()
    opt.step()
    opt.zero_grad()
