# corpus: style=accelerate class=F10
# The loss runs through accelerator.unwrap_model(model).method(...): DDP's forward never runs,
# so the backward reduces nothing and each rank steps on its own gradient.
import torch
from accelerate import Accelerator


def train(model, opt, loader, epochs):
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    scorer = accelerator.unwrap_model(model)
    for _ in range(epochs):
        for chosen, rejected in loader:
            with accelerator.accumulate(model):
                loss = scorer.pairwise_loss(chosen, rejected)  # expect: AG300
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
