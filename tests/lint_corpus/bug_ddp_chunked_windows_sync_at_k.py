# corpus: style=ddp class=F11
# the loader is grouped into windows by a generator that yields the epoch's remainder as a last,
# shorter window; the sync flag is armed at position K - 1, which a short window never reaches
import torch.nn.functional as F


def chunked(loader, k):
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == k:
            yield window
            window = []
    if window:
        yield window


for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for window in chunked(loader, ACCUM):
        for j, (x, y) in enumerate(window):
            ddp_model.require_backward_grad_sync = j == ACCUM - 1  # expect: AG151
            loss = F.cross_entropy(ddp_model(x), y) / len(window)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
