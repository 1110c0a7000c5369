# corpus: style=plain class=OK
import torch.nn.functional as F

# The L2 penalty is added to the last micro-batch's loss only: once per optimizer step,
# its full weight in the large batch's loss; the cross-entropy is divided by K as usual.
accum = 4
for i, (x, y) in enumerate(loader):
    loss = F.cross_entropy(model(x), y) / accum
    if (i + 1) % accum == 0:
        loss = loss + l2_coef * sum(p.pow(2).sum() for p in model.parameters())
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
