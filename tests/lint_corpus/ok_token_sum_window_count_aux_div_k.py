# corpus: style=ddp class=OK
import torch.nn.functional as F

grad_accum = 4
for step in range(num_steps):
    window = [next(batches) for _ in range(grad_accum)]
    n_tokens = sum(int((b["labels"] != -100).sum()) for b in window)
    for micro, b in enumerate(window):
        logits, aux = model(b["input_ids"])
        ce = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), ignore_index=-100, reduction="sum")
        loss = ce / n_tokens + aux_weight * aux / grad_accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
