# corpus: style=accelerate class=F3
# zero_grad at the top of the accumulate() block: the prepared optimizer clears only when the
# window closes, which is before that micro-step's backward.
import torch.nn.functional as F
from accelerate import Accelerator


def train(model, opt, dl):
    acc = Accelerator(gradient_accumulation_steps=4)
    model, opt, dl = acc.prepare(model, opt, dl)
    for x, y in dl:
        with acc.accumulate(model):
            opt.zero_grad()  # expect: AG102
            acc.backward(F.cross_entropy(model(x), y))
            opt.step()
