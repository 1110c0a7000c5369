# corpus: style=ddp class=OK
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(lm)
world_size = dist.get_world_size()
for batch in loader:
    n_tokens = (batch["labels"] != -100).sum()
    dist.all_reduce(n_tokens)
    logits = model(batch["input_ids"])
    tok_loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum", ignore_index=-100
    )
    loss = tok_loss * world_size / n_tokens
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
