# corpus: style=nanogpt class=OK
# Packed documents with boundary targets set to -1: each micro-batch's token sum over the
# window's target count; a single-process reference follows the training.
import torch
import torch.nn.functional as F

gradient_accumulation_steps = 4


def run(model, ref, opt, windows, vocab):
    for window in windows:
        n_window = sum(int((Y != -1).sum()) for _, Y in window)
        for X, Y in window:
            logits = model(X)
            loss = F.cross_entropy(logits.view(-1, vocab), Y.view(-1), ignore_index=-1, reduction="sum")
            loss = loss / n_window
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for window in windows:
        total, n = 0.0, 0
        for X, Y in window:
            total = total + F.cross_entropy(ref(X).view(-1, vocab), Y.view(-1), ignore_index=-1, reduction="sum")
            n += int((Y != -1).sum())
        (total / n).backward()
