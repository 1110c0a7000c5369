# corpus: style=plain class=LOSS_SCALE
import torch.nn.functional as F

accum_steps = 4
for step in range(num_steps):
    for micro in range(accum_steps):
        logits, balance = model(next(batches))
        (F.cross_entropy(logits, targets) / accum_steps + 0.01 * balance).backward()  # expect: AG127
    optimizer.step()
    optimizer.zero_grad()
