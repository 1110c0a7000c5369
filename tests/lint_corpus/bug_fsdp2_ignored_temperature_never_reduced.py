# corpus: style=fsdp2 class=F10
# a learned temperature left out of FSDP2 (ignored_params) and never averaged by hand
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

K = 4
fully_shard(model.query)
fully_shard(model.doc)
fully_shard(model, ignored_params={model.logit_scale})  # expect: AG337
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(100):
    for k in range(K):
        model.set_requires_gradient_sync(k == K - 1)
        q, d = next(batches)
        (clip_loss(model(q, d)) / K).backward()
    opt.step()
    opt.zero_grad()
