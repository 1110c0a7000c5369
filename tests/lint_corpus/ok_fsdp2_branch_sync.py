# corpus: style=fsdp2 class=OK
from torch.distributed.fsdp import fully_shard

fully_shard(model)
for i, batch in enumerate(loader):
    if (i + 1) % accumulation_steps == 0:
        model.set_requires_gradient_sync(True)
    else:
        model.set_requires_gradient_sync(False)
    loss = model(batch).mean() / accumulation_steps
    loss.backward()
    if (i + 1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
