# corpus: style=plain class=F5
# a masked-token objective: the mean over the positions a boolean mask selects (a different
# number in every micro-batch) divided by K weights short micro-batches up
import torch
import torch.nn.functional as F

MASK_ID = 0


def train(model, opt, windows, accum=4):
    for window in windows:
        for batch in window:
            logits = model(batch["noisy"])
            sel = batch["noisy"] == MASK_ID
            loss = F.cross_entropy(logits[sel], batch["clean"][sel]) / accum  # expect: AG104
            loss.backward()
        opt.step()
        opt.zero_grad()
