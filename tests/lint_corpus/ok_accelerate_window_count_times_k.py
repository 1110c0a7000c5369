# corpus: style=accelerate class=OK
# Each micro-batch's summed loss over its window's samples, times K: accelerator.backward
# divides by K, so each sample weighs 1 / (samples of its window).
import torch.nn.functional as F
from accelerate import Accelerator

CONF = {"accum": 4, "bs": 8, "batches_per_epoch": 10}


def windows_of_epoch(nb, k):
    return [list(range(s, min(s + k, nb))) for s in range(0, nb, k)]


def train(model, opt, dl):
    K, bs, nb = CONF["accum"], CONF["bs"], CONF["batches_per_epoch"]
    acc = Accelerator(cpu=True, gradient_accumulation_steps=K)
    model, opt, dl = acc.prepare(model, opt, dl)
    win_n = {}
    for w in windows_of_epoch(nb, K):
        for i in w:
            win_n[i] = len(w) * bs
    for i, (xb, yb) in enumerate(dl):
        with acc.accumulate(model):
            loss = F.cross_entropy(model(xb), yb, reduction="sum") / win_n[i] * K
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
