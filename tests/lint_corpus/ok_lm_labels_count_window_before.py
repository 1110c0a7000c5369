# corpus: style=plain class=OK
# the window's label count, made before its micro-batches run, normalises every micro-batch
import torch
import torch.nn.functional as F

grad_accum_steps = 8
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(num_steps):
    window = [next(batches) for _ in range(grad_accum_steps)]
    n_labels = sum(int((b["labels"] != -100).sum()) for b in window)
    for batch in window:
        labels = batch["labels"]
        logits = model(batch["input_ids"])
        tok = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        loss = tok / n_labels
        loss.backward()
    opt.step()
    opt.zero_grad()
