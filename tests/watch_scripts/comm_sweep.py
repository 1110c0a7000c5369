"""The collective ledger's scenarios on 2 real gloo ranks in one torchrun launch, each
recorded in its own directory (``torchrun --nproc-per-node 2 comm_sweep.py OUT_DIR [NAME ...]``).

The loops are sweep_dist.py's (K = 4, 3 optimizer steps, a small MLP), plus DDP syncing on
every micro-step (no ``no_sync`` at all) and DDP with small buckets (several all-reduces
per synced backward). ``comm_sweep.py run NAME``: one scenario unrecorded.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from sweep_dist import K, ce, data, ddp, fsdp2, mlp
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard.watch._recording import recording


def ddp_every(bucket_cap_mb: float | None = None) -> None:
    """No no_sync anywhere (syncs every micro-step), or deferred with small buckets."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, 4)) if bucket_cap_mb else mlp()
    model = DDP(net, bucket_cap_mb=bucket_cap_mb) if bucket_cap_mb else DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(data()):
        last = (i + 1) % K == 0
        defer = bucket_cap_mb is not None and not last
        with model.no_sync() if defer else contextlib.nullcontext():
            ce(model(x), y).backward()
        if last:
            opt.step()
            opt.zero_grad()


SCENARIOS: dict[str, Callable[[], None]] = {
    "ddp_ok": lambda: ddp("ok"),
    "ddp_backward_only": lambda: ddp("wasteful"),  # no_sync around the backward only
    "ddp_every": lambda: ddp_every(),
    "ddp_buckets": lambda: ddp_every(0.005),
    "fsdp2_ok": lambda: fsdp2("ok"),
    "fsdp2_every": lambda: fsdp2("wasteful"),
}


def main() -> None:
    dist.init_process_group("gloo")
    try:
        if sys.argv[1] == "run":
            SCENARIOS[sys.argv[2]]()
            return
        out = Path(sys.argv[1])
        for name in sys.argv[2:] or list(SCENARIOS):
            with recording(out / name):
                SCENARIOS[name]()
            dist.barrier()
    finally:
        dist.barrier()
        dist.destroy_process_group()
    if os.environ.get("RANK") == "0":
        print("swept")


if __name__ == "__main__":
    main()
