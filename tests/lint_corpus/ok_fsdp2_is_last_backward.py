# corpus: style=fsdp2 class=OK
from torch.distributed.fsdp import fully_shard

fully_shard(model)
for step in range(steps):
    for m in range(K):
        last = m == K - 1
        model.set_is_last_backward(last)
        model.set_requires_gradient_sync(last)
        (model(next(it)).sum() / K).backward()
    optimizer.step()
    optimizer.zero_grad()
