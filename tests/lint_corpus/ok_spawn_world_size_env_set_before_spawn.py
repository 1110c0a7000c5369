# corpus: style=spawn class=OK
"""Regression on ranks started with torch.multiprocessing.spawn; gradients averaged by hand."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = int(os.getenv("WORLD_SIZE", 1))
ACCUM = 4


def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(WORLD)


def worker(rank, nprocs, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=nprocs)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(64, 8)
    target = torch.randn(64, 1)
    for step in range(8):
        for micro in range(ACCUM):
            i = (step * ACCUM + micro) * 2 + rank
            loss = torch.nn.functional.mse_loss(model(data[i:i + 1]), target[i:i + 1]) / ACCUM
            loss.backward()
        average_gradients(model)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ["WORLD_SIZE"] = "2"
    mp.spawn(worker, args=(2, 29533), nprocs=2, join=True)
