# corpus: style=accelerate class=F7
# accumulate() over the DataLoader the script built: prepare() only saw the model and the
# optimizer.
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader


def train(model, opt, dataset, epochs):
    acc = Accelerator(gradient_accumulation_steps=4)
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    model, opt = acc.prepare(model, opt)
    for _ in range(epochs):
        for x, y in loader:  # expect: AG161
            with acc.accumulate(model):
                acc.backward(F.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
