# corpus: style=hand_ddp class=OK
# a leftover helper that sums the gradients over the ranks is defined but never called:
# DDP averages them, nothing else reduces
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def allreduce_grads(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def main():
    model = DDP(net)
    for step, window in enumerate(windows(loader, 4)):
        for i, (x, y) in enumerate(window):
            (loss_fn(model(x), y) / 4).backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
