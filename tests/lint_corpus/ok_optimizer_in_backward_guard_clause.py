# corpus: style=plain class=OK
"""Optimizer in backward with accumulation: the hook leaves early until the loop marks the
window's last micro-batch, so each parameter steps once per window."""
import torch

ACCUM = 4
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


class PerParamStepper:
    def __init__(self, params):
        self.boundary = False
        self.opts = {p: torch.optim.AdamW([p], lr=1e-3) for p in params}
        for p in params:
            p.register_post_accumulate_grad_hook(self.on_grad)

    def on_grad(self, param):
        if not self.boundary:
            return
        self.opts[param].step()
        self.opts[param].zero_grad(set_to_none=True)


stepper = PerParamStepper(list(model.parameters()))
for step in range(1000):
    for micro in range(ACCUM):
        stepper.boundary = micro == ACCUM - 1
        x, y = next(data)
        loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
        loss.backward()
