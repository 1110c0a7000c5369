# corpus: style=hf_hand_loop class=OK
# the model normalises by the window's label-token count (num_items_in_batch): no /K
import torch
import torch.nn.functional as F


def train(model, windows, opt, accum):
    for window in windows:
        for batch in window:
            batch["labels"][batch["attention_mask"] == 0] = -100
        n_items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in window)
        for batch in window:
            out = model(**batch, num_items_in_batch=n_items)
            out.loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        total = 0.0
        for batch in windows[-1]:
            logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
            total += F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(),
                                     ignore_index=-100, reduction="sum").item()
    return total
