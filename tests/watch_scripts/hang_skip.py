"""A 2-rank training loop where rank 0 skips one all_reduce (``accumguard watch`` hang test).

K = 2 micro-steps per optimizer step; after each backward both ranks all-reduce the
detached loss (for logging). At step 3, micro-step 2 (1-based) rank 0 skips it: with
``--then sleep`` it then hangs elsewhere (the launcher kills it once rank 1's
process-group timeout fires); with ``--then exit`` it leaves the loop and exits.
Rank 1 waits in its 6th all_reduce until the 5 s gloo timeout (or the peer's exit).
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--then", choices=("sleep", "exit"), default="sleep")
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 5):
        opt.zero_grad()
        for micro in (1, 2):
            x = torch.randn(8, 4)
            loss = model(x).pow(2).mean() / 2
            loss.backward()
            if rank == 0 and step == 3 and micro == 2:
                if args.then == "sleep":
                    time.sleep(120)  # stuck elsewhere: the launcher's SIGTERM ends it
                return
            dist.all_reduce(loss.detach().clone())
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
