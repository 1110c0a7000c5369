# corpus: style=rl class=OK
# one backward per optimizer step (no accumulation): a masked token mean is the batch's mean
import torch

for batch in loader:
    lp = policy(batch["ids"]).log_softmax(-1).gather(-1, batch["labels"][..., None]).squeeze(-1)
    m = batch["mask"]
    loss = -(batch["adv"][:, None] * lp * m).sum() / m.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
