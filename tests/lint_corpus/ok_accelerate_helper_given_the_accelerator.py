# corpus: style=accelerate class=OK
"""A metrics helper handed the training's Accelerator; another helper built before the
training's Accelerator (which then sets K again)."""
import torch
from accelerate import Accelerator


class Meter:
    def __init__(self, accelerator):
        self.accelerator = accelerator

    def update(self, loss):
        return self.accelerator.gather(loss.detach()).mean()


def probe_devices():
    return Accelerator(cpu=True).num_processes


def main():
    n = probe_devices()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, opt, loader = accelerator.prepare(build_model(), build_opt(), build_loader())
    meter = Meter(accelerator)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(batch).mean()
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        meter.update(loss)


main()
