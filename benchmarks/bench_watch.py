"""Overhead of what ``accumguard watch`` installs in each rank (the observation layer with
its recorder, :func:`accumguard.runtime.watch.recording`) on the demo models: the same
accumulation loop with and without it, alternating which goes first, timed in process
CPU time (one thread: the cost is Python work per event, and CPU time is what a shared,
loaded machine measures least badly). Prints the median per-step time ratio per model.

Steady state: after installing, ``--warm`` steps run untimed (the first two windows'
conservation is always checked; afterwards it is sampled within ~1 % of the run's time).

    python benchmarks/bench_watch.py [--steps 20] [--k 4] [--reps 11] [--warm 3] [--models toy,demo-lm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import torch

from accumguard.demo.toy import (
    TinyCausalLM,
    TokenMLP,
    make_lm_batches,
    make_rank_batches,
    token_loss,
)
from accumguard.runtime.watch import recording

MODELS: dict[str, Any] = {
    "toy": (TokenMLP, lambda: make_rank_batches(seed=0, world_size=1, micro_batches=16)[0]),
    "demo-lm": (TinyCausalLM, lambda: make_lm_batches(seed=0, world_size=1, micro_batches=16,
                                                      micro_batch_size=4, seq_len=32)[0]),
}


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, data: list, k: int,
           steps: int) -> float:
    t0 = time.process_time()
    for s in range(steps):
        for j in range(k):
            loss, _ = token_loss(model, data[(s * k + j) % len(data)])
            (loss / 100).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return (time.process_time() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--warm", type=int, default=3,
                   help="untimed optimizer steps after installing (steady state)")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}; K={args.k}, {args.steps} steps per timing, "
          f"median of {args.reps} alternating repetitions, process CPU time")
    for name in args.models.split(","):
        cls, data_fn = MODELS[name]
        torch.manual_seed(0)
        model = cls()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = data_fn()
        _steps(model, opt, data, args.k, 3)  # warm-up
        plain, observed, ratios = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.reps):
                got = {}
                for which in (("plain", "watch") if rep % 2 == 0 else ("watch", "plain")):
                    if which == "plain":
                        got[which] = _steps(model, opt, data, args.k, args.steps)
                    else:
                        with recording(os.path.join(tmp, str(rep))):  # as watch installs it
                            # steady state: the first windows (conservation always checked)
                            # are untimed, as in bench_guard.py
                            _steps(model, opt, data, args.k, args.warm)
                            got[which] = _steps(model, opt, data, args.k, args.steps)
                plain.append(got["plain"])
                observed.append(got["watch"])
                ratios.append(got["watch"] / got["plain"])
        a, b = statistics.median(plain), statistics.median(observed)
        print(f"{name}, K={args.k}: plain {a * 1e3:.2f} ms/step, watch {b * 1e3:.2f} ms/step, "
              f"ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
