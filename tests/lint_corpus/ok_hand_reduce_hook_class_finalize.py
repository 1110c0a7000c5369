# corpus: style=hand_reduce class=OK
# each micro-batch's incoming gradient is summed over ranks in a tensor hook; a sibling method
# divides the accumulated gradient by the world size once, before the step
import torch.distributed as dist


class GradAllReduce:
    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        self.handles = [p.register_hook(self._hook) for p in self.params]

    @staticmethod
    def _hook(grad):
        grad = grad.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad

    def finalize(self, world_size):
        for p in self.params:
            p.grad.div_(world_size)


reducer = GradAllReduce(model.parameters())
for step in range(steps):
    for k in range(ACCUM):
        loss = loss_fn(model(x[step, k]), y[step, k]) / ACCUM
        loss.backward()
    reducer.finalize(dist.get_world_size())
    opt.step()
    opt.zero_grad()
