# corpus: style=hf class=F5
import torch.nn.functional as F

grad_accum = 8
for i, batch in enumerate(loader):
    logits = model(batch["input_ids"]).logits
    per_tok = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="none")
    mask = (batch["labels"].flatten() != -100).float()
    loss = (per_tok * mask).sum() / mask.sum()
    loss = loss / grad_accum  # expect: AG104
    loss.backward()
    if (i + 1) % grad_accum == 0:
        optimizer.step()
        optimizer.zero_grad()
