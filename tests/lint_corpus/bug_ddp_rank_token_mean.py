# corpus: style=ddp class=F6
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(lm)
for batch in loader:
    logits = model(batch["input_ids"])
    tok_loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum", ignore_index=-100
    )
    n_tokens = (batch["labels"] != -100).sum()
    loss = tok_loss / n_tokens  # expect: AG113
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
