# corpus: style=plain class=F8
import torch

grad_accum = 16
for it, batch in enumerate(batches):
    loss = model(**batch).loss / grad_accum
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)  # expect: AG105
    if (it + 1) % grad_accum == 0:
        optimizer.step()
        optimizer.zero_grad()
