# corpus: style=plain class=OK
# the masked-token objective summed and divided by the window's count of masked positions
import torch
import torch.nn.functional as F

MASK_ID = 0


def train(model, opt, windows, accum=4):
    for window in windows:
        n_sel = sum(int((b["noisy"] == MASK_ID).sum()) for b in window)
        for batch in window:
            logits = model(batch["noisy"])
            sel = batch["noisy"] == MASK_ID
            loss = F.cross_entropy(logits[sel], batch["clean"][sel], reduction="sum") / n_sel
            loss.backward()
        opt.step()
        opt.zero_grad()
