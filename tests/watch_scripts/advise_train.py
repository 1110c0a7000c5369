"""A training script for ``accumguard advise`` (2 gloo ranks, K = 4, 8 optimizer steps),
written the way users get it wrong: ``--engine ddp`` enters ``no_sync()`` around the
backward only (DDP decided at the forward: it still all-reduces every micro-step);
``--engine fsdp2`` never calls ``set_requires_gradient_sync`` (reduce-scatters every
micro-step). Seeds itself; its updates are the large batch's in every mode."""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist

K, STEPS, MB, WIDTH = 4, 8, 8, 256


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=("ddp", "fsdp2"), default="ddp")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, WIDTH), torch.nn.Tanh(),
                              torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                              torch.nn.Linear(WIDTH, 8))
    if args.engine == "ddp":
        model: torch.nn.Module = torch.nn.parallel.DistributedDataParallel(net)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in (net[0], net[2], net[4]):
            fully_shard(layer, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(10 + dist.get_rank())
    for _ in range(STEPS):
        for j in range(K):
            x, y = torch.randn(MB, 32, generator=g), torch.randint(0, 8, (MB,), generator=g)
            loss = torch.nn.functional.cross_entropy(model(x), y) / K
            last = j == K - 1
            wrong = args.engine == "ddp" and not last
            with model.no_sync() if wrong else contextlib.nullcontext():  # type: ignore[operator]
                loss.backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
