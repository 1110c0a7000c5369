# corpus: style=accelerate class=F1
"""A metrics helper that builds its own Accelerator after the training's: Accelerate's
shared GradientState takes its K of 1 (blind round 121 b_b02)."""
import torch
from accelerate import Accelerator


class Meter:
    def __init__(self):
        self.accelerator = Accelerator(cpu=True)  # expect: AG340

    def update(self, loss):
        return self.accelerator.gather(loss.detach()).mean()


def main():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, opt, loader = accelerator.prepare(build_model(), build_opt(), build_loader())
    meter = Meter()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(batch).mean()
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        meter.update(loss)


main()
