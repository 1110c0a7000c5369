# corpus: style=accelerate class=OK
# The loss runs through the prepared model; unwrap_model only for saving at the end.
import torch
from accelerate import Accelerator


def train(model, opt, loader, epochs):
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for _ in range(epochs):
        for chosen, rejected in loader:
            with accelerator.accumulate(model):
                loss = model(chosen, rejected)
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
    plain = accelerator.unwrap_model(model)
    plain.save_pretrained("out")
