# corpus: style=rl class=LOSS_SCALE
# sequence-level mean of per-token means (GRPO's original normaliser) on each micro-batch,
# optimizer gated by a modulo, the loss never divided by the accumulation steps
import torch

gradient_accumulation_steps = 4

for step, batch in enumerate(loader):
    logits = model(batch["input_ids"]).logits[:, :-1]
    lp = logits.log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    completion_mask = batch["completion_mask"][:, 1:].float()
    per_token = -(lp * batch["advantages"][:, None])
    loss = ((per_token * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()
    loss.backward()  # expect: AG129
    if (step + 1) % gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
