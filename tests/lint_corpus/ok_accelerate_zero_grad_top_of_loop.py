# corpus: style=accelerate class=OK
# zero_grad at the top of the loop, outside accumulate(): on the micro-step after a boundary
# it clears what the last step used; elsewhere the prepared optimizer skips it.
import torch.nn.functional as F
from accelerate import Accelerator


def train(model, opt, dl):
    acc = Accelerator(gradient_accumulation_steps=4)
    model, opt, dl = acc.prepare(model, opt, dl)
    for x, y in dl:
        opt.zero_grad()
        with acc.accumulate(model):
            acc.backward(F.cross_entropy(model(x), y))
            opt.step()
