# corpus: style=accelerate class=OK
# accumulate() over the prepared DataLoader.
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader


def train(model, opt, dataset, epochs):
    acc = Accelerator(gradient_accumulation_steps=4)
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    for _ in range(epochs):
        for x, y in loader:
            with acc.accumulate(model):
                acc.backward(F.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
