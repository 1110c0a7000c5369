# corpus: style=plain class=LOSS_SCALE
# each micro-batch's summed token loss over its own label count, backwarded K times as is
import torch
import torch.nn.functional as F

grad_accum_steps = 8
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step, batch in enumerate(loader):
    labels = batch["labels"]
    logits = model(batch["input_ids"])
    tok = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    loss = tok / (labels != -100).sum()
    loss.backward()  # expect: AG129
    if (step + 1) % grad_accum_steps == 0:
        opt.step()
        opt.zero_grad()
