# corpus: style=fsdp2 class=OK
# the same temperature averaged by hand before the step (FSDP2 does not reduce it)
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

K = 4
fully_shard(model.query)
fully_shard(model.doc)
fully_shard(model, ignored_params={model.logit_scale})
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(100):
    for k in range(K):
        model.set_requires_gradient_sync(k == K - 1)
        q, d = next(batches)
        (clip_loss(model(q, d)) / K).backward()
        g = model.logit_scale.grad
        dist.all_reduce(g)
        g.div_(dist.get_world_size())
    opt.step()
    opt.zero_grad()
