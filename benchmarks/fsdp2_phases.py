"""Where an FSDP2 window with ``window_memory="unsharded"`` spends its CPU time against the
limit (the bench's compute + one all-reduce): per rank, CPU ms per optimizer step in the
forwards, the backwards of micro-steps 1..K-1, the last backward (which reduce-scatters),
the boundary's non-finite check, the optimizer step and ``zero_grad``; the variants
alternate step by step.

CPU time, not wall time: on a shared machine the waits inside collectives are the
neighbours' load. Nested timings are counted once.

Usage::

    python benchmarks/fsdp2_phases.py 12            # 12 timed steps per variant
    python benchmarks/fsdp2_phases.py 12 --profile  # and a cProfile of rank 0, default variant
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from accumguard import run_on_ranks
from accumguard.demo import _bench_setup as setup

PHASES = ("forward", "backward", "last backward", "nonfinite", "step", "zero_grad")
COUNTS = ("all-gathers", "skipped")
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("limit", {}),
    ("FSDP2, no fast path", {"skip_hooks": False, "pair": False}),
    ("FSDP2, idle hooks skipped", {"skip_hooks": True, "pair": False}),
    ("FSDP2, pair all-reduce", {"skip_hooks": False, "pair": True}),
    ("FSDP2, both (default)", {"skip_hooks": True, "pair": True}),
]


def worker(rank: int, world: int, args: argparse.Namespace,
           ) -> tuple[dict[tuple[str, str], float], dict[str, float], str]:
    setup._setup_worker()
    from accumguard.engines.fsdp2 import FSDP2Engine as Adapter

    spent: dict[tuple[str, str], float] = collections.defaultdict(float)
    current = [""]
    depth = [0]
    last = [False]

    def timed(phase: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            depth[0] += 1
            c0 = time.process_time()
            try:
                return real(*a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    name = "last backward" if phase == "backward" and last[0] else phase
                    spent[(current[0], name)] += time.process_time() - c0

        return call

    real_micro = Adapter.micro_step

    def micro_step(self: Adapter, *, is_last: bool) -> Any:
        last[0] = is_last
        return real_micro(self, is_last=is_last)

    Adapter.micro_step = micro_step  # type: ignore[method-assign]  # timing only
    setup.sum_loss = timed("forward", setup.sum_loss)  # type: ignore[assignment]  # timing only
    Adapter.backward = timed("backward", Adapter.backward)  # type: ignore[method-assign]
    Adapter.nonfinite_grads = timed("nonfinite", Adapter.nonfinite_grads)  # type: ignore[method-assign]
    Adapter.optimizer_step = timed("step", Adapter.optimizer_step)  # type: ignore[method-assign]
    Adapter.zero_grad = timed("zero_grad", Adapter.zero_grad)  # type: ignore[method-assign]
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)  # type: ignore[method-assign]
    torch.manual_seed(0)
    runs = {}
    for name, kw in VARIANTS:
        runs[name] = (setup._build_local(args, with_allreduce=True) if name == "limit" else
                      setup._build_fsdp2(args, "deferred", "unsharded", **kw))
    batches = setup.make_batches(rank, args.k, args.micro, args.dim)
    for name, run in runs.items():  # warm-up: buffers, optimizer state, FSDP2's lazy init
        current[0] = name
        last[0] = False
        run(batches)
        run(batches)
    spent.clear()
    gathers = {name: getattr(getattr(run, "engine", None), "all_gathers", 0)
               for name, run in runs.items()}
    skipped = {name: getattr(getattr(getattr(run, "engine", None), "idle_hooks", None),
                             "skipped", 0) for name, run in runs.items()}
    total: dict[str, float] = collections.defaultdict(float)
    prof = cProfile.Profile() if args.profile and rank == 0 else None
    for i in range(args.steps):
        for name, run in (list(runs.items()) if i % 2 == 0 else list(runs.items())[::-1]):
            current[0] = name
            last[0] = False
            c0 = time.process_time()
            if prof is not None and name == args.profile_variant:
                prof.enable()
            run(batches)
            if prof is not None:
                prof.disable()
            total[name] += time.process_time() - c0
    for name, run in runs.items():
        engine = getattr(run, "engine", None)
        idle = getattr(engine, "idle_hooks", None)
        # counts per step (the division by steps below), shown ×1000 like the times
        spent[(name, "all-gathers")] = (getattr(engine, "all_gathers", 0) - gathers[name]) / 1000
        spent[(name, "skipped")] = (getattr(idle, "skipped", 0) - skipped[name]) / 1000
    text = ""
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(45)
        out.write("\n")
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(60)
        text = out.getvalue()
    return ({k: v / args.steps for k, v in spent.items()},
            {k: v / args.steps for k, v in total.items()}, text)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int, nargs="?", default=12)
    p.add_argument("--profile", action="store_true")
    ns = p.parse_args(argv)
    args = argparse.Namespace(k=8, micro=8, dim=512, hidden=2048, steps=ns.steps,
                              profile=ns.profile, profile_variant=VARIANTS[-1][0])
    res = run_on_ranks(worker, 2, (args,), timeout=1500)
    for rank in (0, 1):
        spent, total, text = res[rank]
        for name, _ in VARIANTS:
            parts = " ".join(f"{p} {spent.get((name, p), 0.0) * 1000:6.1f}" for p in PHASES)
            parts += " | per step: " + " ".join(
                f"{c} {spent.get((name, c), 0.0) * 1000:.1f}" for c in COUNTS)
            print(f"rank {rank} {name:28} CPU ms per step {total[name] * 1000:6.1f}: {parts}")
        if text:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
