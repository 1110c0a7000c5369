# corpus: style=accelerate class=F1
# the K batches of each window are drawn from the prepared loader first (to count their
# tokens), for len(loader) // K windows, inside accumulate() with sync_with_dataloader on
# (the default): when K divides the loader's length the last window takes its last batch
# before any of its micro-steps, and each of them then syncs and steps (a warning: the
# length is not in the source)
import torch
from accelerate import Accelerator


def fit(model, opt, dataset, K=4, bs=8):
    accelerator = Accelerator(gradient_accumulation_steps=K)
    loader = torch.utils.data.DataLoader(dataset, batch_size=bs)
    windows = len(loader) // K
    model, opt, loader = accelerator.prepare(model, opt, loader)
    stream = iter(loader)
    for _ in range(windows):
        chunk = [next(stream) for _ in range(K)]
        n_tok = sum(int((b["labels"] != -100).sum()) for b in chunk)
        for b in chunk:
            with accelerator.accumulate(model):  # expect: AG148
                out = model(b["input_ids"])
                loss = torch.nn.functional.cross_entropy(  # expect: AG113
                    out.flatten(0, 1), b["labels"].flatten(), reduction="sum") / n_tok * K
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
