# corpus: style=fabric class=OK
"""The fixed twin of bug_one_based_index_plus_one_boundary: counted from 0, as the helper
expects (blind round 127 c_b03 fixed)."""
import torch.nn.functional as F


class RewardTrainer:
    def __init__(self, fabric, grad_accum):
        self.fabric, self.grad_accum = fabric, grad_accum

    def _is_boundary(self, i):
        return (i + 1) % self.grad_accum == 0

    def train_epoch(self, model, opt, loader):
        for step, (x, y) in enumerate(loader):
            boundary = self._is_boundary(step)
            with self.fabric.no_backward_sync(model, enabled=not boundary):
                self.fabric.backward(F.mse_loss(model(x), y) / self.grad_accum)
            if boundary:
                opt.step()
                opt.zero_grad()
        opt.zero_grad()  # the epoch's leftover is dropped
