# corpus: style=hand class=OK
import torch
import torch.nn.functional as F

accum_steps = 8


def run_window(model, batches):
    for xb, yb in batches:
        loss = F.cross_entropy(model(xb), yb) / accum_steps
        loss.backward()


def train(model, opt, get_batch, max_iters, log_every=10):
    for it in range(max_iters):
        window = [get_batch() for _ in range(accum_steps)]
        run_window(model, window)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if it % log_every == 0:
            print(it)


def run_chunks(model, xb, yb, n_chunks=4):
    """One micro-batch split into chunks to save memory: the loop's K windows are of these."""
    for xc, yc in zip(xb.chunk(n_chunks), yb.chunk(n_chunks)):
        (F.cross_entropy(model(xc), yc) / (n_chunks * accum_steps)).backward()


def train_chunked(model, opt, loader):
    for i, (xb, yb) in enumerate(loader):
        run_chunks(model, xb, yb)
        if (i + 1) % accum_steps == 0:
            opt.step()
            opt.zero_grad()
