# corpus: style=class_trainer class=F3
# autograd.grad's gradients written back with `p.grad = g` on every micro-step; the
# optimizer steps in a helper the loop calls after the window: only the last micro-batch
import torch
import torch.distributed as dist

ACCUM = 4


class Distiller:
    def accumulate(self, loss):
        grads = torch.autograd.grad(loss / ACCUM, self.params)
        for p, g in zip(self.params, grads):
            p.grad = g  # expect: AG167

    def sync_and_step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= self.world
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self, batches):
        for _ in range(10):
            for _ in range(ACCUM):
                self.accumulate(self.loss(next(batches)))
            self.sync_and_step()
