# corpus: style=nanogpt class=OK
"""The window's token count as Python's sum of mask counts, converted first and then
all-reduced in place: every rank divides by the count over all ranks."""
import torch.distributed as dist


def train_window(model, window, world):
    n_tok = sum((Y != -1).sum() for _, Y in window).float()
    dist.all_reduce(n_tok)
    for X, Y in window:
        loss = model(X, Y) / n_tok * world
        loss.backward()
