# corpus: style=plain class=OK
import torch.nn.functional as F

accumulation_steps = 4
for step in range(num_steps):
    for micro in range(accumulation_steps):
        logits, aux = model(next(batches))
        loss = F.cross_entropy(logits, targets) + aux_coef * aux
        loss = loss / accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
