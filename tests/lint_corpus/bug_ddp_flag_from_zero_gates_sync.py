# corpus: style=ddp class=F13
from contextlib import nullcontext

ACCUM_ITERS = 4


def fit(ddp_model, optim, batches, criterion):
    for micro_idx, (inputs, targets) in enumerate(batches):
        is_boundary = micro_idx % ACCUM_ITERS == 0
        with nullcontext() if is_boundary else ddp_model.no_sync():
            (criterion(ddp_model(inputs), targets) / ACCUM_ITERS).backward()
        if is_boundary:  # expect: AG115
            optim.step()
            optim.zero_grad(set_to_none=True)
