# corpus: style=nanogpt class=OK
"""A gradient-logging helper whose observe() only reads the norm (get_total_norm) after every
micro-step's backward; the clip runs once per window before the step."""
import torch


class GradMonitor:
    def __init__(self):
        self.norms = []

    def observe(self, model):
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        self.norms.append(float(norm))


def train(model, optimizer, get_batch, iters, accum, clip):
    monitor = GradMonitor()
    for it in range(iters):
        for micro_step in range(accum):
            model.require_backward_grad_sync = micro_step == accum - 1
            x, y = get_batch()
            loss = model(x, y) / accum
            loss.backward()
            monitor.observe(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
