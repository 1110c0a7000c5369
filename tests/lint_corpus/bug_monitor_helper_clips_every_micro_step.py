# corpus: style=nanogpt class=F8
"""A gradient-logging helper whose observe() calls clip_grad_norm_ (to read the norm) after
every micro-step's backward: it clips each partial gradient (blind round 123 c_b01)."""
import torch


class GradMonitor:
    def __init__(self, clip):
        self.clip, self.norms = clip, []

    def observe(self, model):
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip)  # expect: AG105
        self.norms.append(float(norm))


def train(model, optimizer, get_batch, iters, accum, clip):
    monitor = GradMonitor(clip)
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
