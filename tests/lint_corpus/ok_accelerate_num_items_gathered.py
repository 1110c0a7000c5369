# corpus: style=accelerate class=OK
# the window's token count is gathered over the ranks before the model divides by it, and
# the loss is multiplied by the number of processes for DDP's average
import contextlib

from accelerate import Accelerator


def count_items(batches):
    return sum((b["labels"][:, 1:] != -100).sum() for b in batches)


def train(model, opt, loader, ga=4, max_steps=10):
    acc = Accelerator()
    model, opt, loader = acc.prepare(model, opt, loader)
    it = iter(loader)
    for _ in range(max_steps):
        window = [next(it) for _ in range(ga)]
        n_items = acc.gather(count_items(window).reshape(1)).sum()
        for i, batch in enumerate(window):
            with acc.no_sync(model) if i < ga - 1 else contextlib.nullcontext():
                out = model(**batch, num_items_in_batch=n_items)
                acc.backward(out.loss * acc.num_processes)
        opt.step()
        opt.zero_grad()
