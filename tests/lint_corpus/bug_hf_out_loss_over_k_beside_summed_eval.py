# corpus: style=hf_hand_loop class=F5
# the model's own loss (a mean over each micro-batch's unmasked label tokens) divided by K;
# a summed cross-entropy in the same function is only the evaluation's
import torch
import torch.nn.functional as F


def train(model, windows, opt, accum):
    for window in windows:
        for batch in window:
            batch["labels"][batch["attention_mask"] == 0] = -100
            out = model(**batch)
            loss = out.loss / accum  # expect: AG104
            loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        total = 0.0
        for batch in windows[-1]:
            logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
            total += F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(),
                                     ignore_index=-100, reduction="sum").item()
    return total
