# corpus: style=hand_reduce class=F10
# a class overlapping the reduction with the backward: its bound method is every parameter's
# post-accumulate hook (first argument self), so each backward sums the running .grad again
import torch
import torch.distributed as dist


class Overlap:
    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        self.world = dist.get_world_size()
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.on_grad)

    def on_grad(self, param):
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)  # expect: AG154

    def finish(self):
        for p in self.params:
            p.grad.div_(self.world)


overlap = Overlap(model.parameters())
for step in range(steps):
    for micro in range(accum):
        loss = torch.nn.functional.mse_loss(model(x[step, micro]), y[step, micro]) / accum
        loss.backward()
    overlap.finish()
    opt.step()
    opt.zero_grad(set_to_none=True)
