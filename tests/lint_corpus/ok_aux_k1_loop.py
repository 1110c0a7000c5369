# corpus: style=plain class=OK
import torch.nn.functional as F

for x, y in loader:
    logits, aux = model(x)
    loss = F.cross_entropy(logits, y) + 0.01 * aux
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
