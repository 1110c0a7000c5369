# corpus: style=plain class=OK
import torch.nn.functional as F

gradient_accumulation_steps = 4


def window(model, opt, micro_batches):
    n_tokens = sum(int((b["labels"] != -100).sum()) for b in micro_batches)
    for b in micro_batches[:gradient_accumulation_steps]:
        logits = model(b["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="sum") / n_tokens
        loss.backward()
    opt.step()
    opt.zero_grad()
