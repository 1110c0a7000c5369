"""Where a ZeRO-3 window with ``window_memory="unsharded"`` spends its CPU time against the
limit (the bench's compute + one all-reduce): per rank, CPU ms per optimizer step in the
forwards, the backwards, the flush (the adapter's ``sync()``) and the step, the variants
alternating step by step: the limit, ZeRO-3 with DeepSpeed's module hooks in every
micro-step (``skip_idle_hooks=False``), without them in the idle micro-steps only (the
window's first and last keep them: ``whole_window=False``), without them in the whole window
(the default: the parameters gathered in one call before the first forward, the phase
``gather``), and the same with ``"memory_efficient_linear": false``
(torch's own linear).

The limit runs torch's ``F.linear``; each ZeRO-3 variant runs the one its engine installed
(the bench does the same). CPU time, not wall time: on a shared machine the waits inside
collectives are the neighbours' load. Nested timings are counted once (the engine's
backward calls ``Tensor.backward``).

Usage::

    python benchmarks/ds_z3_phases.py 12      # 12 timed steps per variant
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from accumguard import run_on_ranks
from accumguard.demo import _bench_setup as setup

PHASES = ("gather", "forward", "backward", "flush", "step")
VARIANTS: list[tuple[str, dict[str, Any], bool]] = [
    ("limit", {}, True),
    ("ZeRO-3, hooks every micro-step", {}, False),
    ("ZeRO-3, hooks skipped in idle micro-steps only", {}, True),
    ("ZeRO-3, hooks skipped in the whole window", {}, True),
    ("ZeRO-3, whole window, memory_efficient_linear false",
     {"memory_efficient_linear": False}, True),
]


def worker(rank: int, world: int, args: argparse.Namespace,
           ) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    setup._setup_worker()
    from accumguard.engines._deepspeed_window import HeldParameters
    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter as Adapter

    spent: dict[tuple[str, str], float] = collections.defaultdict(float)
    current = [""]
    depth = [0]

    def timed(phase: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            depth[0] += 1
            c0 = time.process_time()
            try:
                return real(*a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[(current[0], phase)] += time.process_time() - c0

        return call

    setup.sum_loss = timed("forward", setup.sum_loss)  # type: ignore[assignment]  # timing only
    Adapter.backward = timed("backward", Adapter.backward)  # type: ignore[method-assign]
    Adapter.sync = timed("flush", Adapter.sync)  # type: ignore[method-assign]
    Adapter.optimizer_step = timed("step", Adapter.optimizer_step)  # type: ignore[method-assign]
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)  # type: ignore[method-assign]
    HeldParameters._gather_window = timed(  # type: ignore[method-assign]
        "gather", HeldParameters._gather_window)
    torch.manual_seed(0)
    runs = {}
    for name, zero, skip in VARIANTS:
        runs[name] = (setup._build_local(args, with_allreduce=True) if name == "limit" else
                      setup._build_deepspeed(args, 3, "deferred", "unsharded", zero_extra=zero,
                                             skip_hooks=skip))
        if "idle micro-steps only" in name:
            runs[name].engine.held.whole_window = False  # type: ignore[attr-defined]
    batches = setup.make_batches(rank, args.k, args.micro, args.dim)
    for name, run in runs.items():  # warm-up: buffers, optimizer state, ZeRO-3's module trace
        current[0] = name
        run(batches)
        run(batches)
    spent.clear()
    total: dict[str, float] = collections.defaultdict(float)
    for i in range(args.steps):
        for name, run in (list(runs.items()) if i % 2 == 0 else list(runs.items())[::-1]):
            current[0] = name
            c0 = time.process_time()
            run(batches)
            total[name] += time.process_time() - c0
    return ({k: v / args.steps for k, v in spent.items()},
            {k: v / args.steps for k, v in total.items()})


def main(argv: list[str]) -> int:
    args = argparse.Namespace(k=8, micro=8, dim=512, hidden=2048,
                              steps=int(argv[0]) if argv else 12)
    res = run_on_ranks(worker, 2, (args,), timeout=1500, env={"DS_ACCELERATOR": "cpu"})
    for rank in (0, 1):
        spent, total = res[rank]
        for name, _, _ in VARIANTS:
            parts = " ".join(f"{p} {spent.get((name, p), 0.0) * 1000:6.1f}" for p in PHASES)
            print(f"rank {rank} {name:52} CPU ms per step {total[name] * 1000:6.1f}: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
