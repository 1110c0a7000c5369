# corpus: style=nanogpt class=F6
"""The window's token count as Python's sum of mask counts (an integer tensor), all-reduced
through `.float()`: the reduction sums into a copy and each rank divides by its own count
(blind round 122 c_b03)."""
import torch.distributed as dist


def train_window(model, window, world):
    n_tok = sum((Y != -1).sum() for _, Y in window)
    dist.all_reduce(n_tok.float())  # expect: AG199
    for X, Y in window:
        loss = model(X, Y) / n_tok * world
        loss.backward()
