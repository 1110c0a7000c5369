# corpus: style=hand_reduce class=OK
# the same class, its hook armed only for the window's last backward: the running .grad is
# summed over the ranks once per step, then divided by W
import torch
import torch.distributed as dist


class Overlap:
    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        self.world = dist.get_world_size()
        self.armed = False
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.on_grad)

    def on_grad(self, param):
        if self.armed:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)

    def finish(self):
        for p in self.params:
            p.grad.div_(self.world)


overlap = Overlap(model.parameters())
for step in range(steps):
    for micro in range(accum):
        overlap.armed = micro == accum - 1
        loss = torch.nn.functional.mse_loss(model(x[step, micro]), y[step, micro]) / accum
        loss.backward()
    overlap.finish()
    opt.step()
    opt.zero_grad(set_to_none=True)
