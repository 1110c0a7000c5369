# corpus: style=hand_reduce class=OK
# a bucketed reducer of the script's own: it sums the accumulated .grad over the ranks once,
# after the window's last backward, then divides by the world size
import torch
import torch.distributed as dist


class Bucketed:
    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        self.world = dist.get_world_size()

    def sync(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        dist.all_reduce(flat)
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in self.params])

    def finish(self):
        for p in self.params:
            p.grad.div_(self.world)


def train(model, opt, stream, steps, k=4):
    bucketed = Bucketed(model.parameters())
    for _ in range(steps):
        for _ in range(k):
            x, y = next(stream)
            (torch.nn.functional.mse_loss(model(x), y) / k).backward()
        bucketed.sync()
        bucketed.finish()
        opt.step()
        opt.zero_grad()
