"""Where a coalesced DeepSpeed step spends its time: the flush (the adapter's ``sync()``,
which closes ``coalesce_grad_reduction()``) and the step (``optimizer_step()``), timed per
rank with ``time.perf_counter`` and ``time.process_time``, ``lean_flush`` on vs off and
ZeRO-2 ``contiguous_gradients: false``, the variants alternating step by step.

CPU time is the figure to read on a shared machine: wall time of a flush is mostly waiting
for the other rank inside the all-reduce, which the neighbours' load decides.

Usage::

    python benchmarks/ds_flush_phases.py 10 2      # 10 timed steps, ZeRO-2
    python benchmarks/ds_flush_phases.py 10 3      # ZeRO-3 (window_memory="unsharded")
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from accumguard import run_on_ranks
from accumguard.demo import _bench_setup as setup

Key = tuple[int, str, str]  # (ZeRO stage, variant, phase)


def worker(rank: int, world: int, args: argparse.Namespace) -> dict[Key, list[tuple[float, float]]]:
    setup._setup_worker()
    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter as Adapter

    rec: dict[Key, list[tuple[float, float]]] = {}

    def timed(phase: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Adapter, *a: Any, **k: Any) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return real(self, *a, **k)
            finally:
                contiguous = getattr(self.engine.optimizer, "contiguous_gradients", None)
                variant = f"lean_flush={self.lean_flush}" + (
                    "" if contiguous else ", contiguous_gradients false") + (
                    "" if self.keep_reduce_bucket or not self.lean_flush or self.stage == 3
                    else ", keep_reduce_bucket=False")
                rec.setdefault((self.stage, variant, phase), []).append(
                    (time.perf_counter() - t0, time.process_time() - c0))

        return call

    Adapter.sync = timed("flush", Adapter.sync)  # type: ignore[method-assign]  # timing only
    Adapter.optimizer_step = timed("step", Adapter.optimizer_step)  # type: ignore[method-assign]
    torch.manual_seed(0)
    runs = []
    for stage in args.stages:
        variants: list[tuple[bool, dict[str, Any], bool]] = [(True, {}, True), (False, {}, True)]
        if stage < 3:
            variants += [(True, {"contiguous_gradients": False}, True), (True, {}, False)]
        for lean, extra, keep in variants:
            runs.append(setup._build_deepspeed(
                args, stage, "deferred", "unsharded" if stage == 3 else "sharded",
                zero_extra=extra, lean=lean, keep_bucket=keep))
    batches = setup.make_batches(rank, args.k, args.micro, args.dim)
    for run in runs:  # warm-up: buffers, optimizer state, ZeRO-3's module trace
        run(batches)
        run(batches)
    rec.clear()
    for i in range(args.steps):
        for run in runs if i % 2 == 0 else runs[::-1]:
            run(batches)
    return rec


def main(argv: list[str]) -> int:
    args = argparse.Namespace(k=8, micro=8, dim=512, hidden=2048,
                              steps=int(argv[0]) if argv else 10,
                              stages=[int(x) for x in argv[1:]] or [2])
    res = run_on_ranks(worker, 2, (args,), timeout=1500, env={"DS_ACCELERATOR": "cpu"})
    for rank in (0, 1):
        for (stage, variant, phase), xs in sorted(res[rank].items()):
            wall = [x[0] * 1000 for x in xs]
            cpu = sorted(x[1] * 1000 for x in xs)
            print(f"rank {rank} ZeRO-{stage} {variant:50} {phase:5}: CPU ms median "
                  f"{statistics.median(cpu):6.1f} (min {cpu[0]:6.1f}); wall ms median "
                  f"{statistics.median(wall):7.1f} over {len(xs)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
