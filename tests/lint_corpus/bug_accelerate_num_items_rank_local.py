# corpus: style=accelerate class=F6
# a hand-written Accelerate loop gives the model num_items_in_batch counted over this
# rank's window only: the model's loss is a rank-local token mean, which DDP then averages
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
        n_items = count_items(window)
        for i, batch in enumerate(window):
            with acc.no_sync(model) if i < ga - 1 else contextlib.nullcontext():
                out = model(**batch, num_items_in_batch=n_items)  # expect: AG113
                acc.backward(out.loss)
        opt.step()
        opt.zero_grad()
