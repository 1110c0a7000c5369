"""Per-step work of watch, guard and the framework callbacks on the demo LM: Python calls
and CPU time per optimizer step added to the same accumulation loop, side by side.

The loop (K micro-steps of forward + backward of the demo's tiny causal LM, the summed
token loss over the window's token count, then clip, AdamW step, scheduler step,
zero_grad) runs plain and under each tool, in one process, one thread:

* **calls/step**: Python function calls per optimizer step added by the tool
  (``sys.setprofile``), counted step by step after ``--warm`` steps over ``--steps`` steps:
  the least step (the per-event work, deterministic) and the mean (with the work sampled
  on a time budget: conservation checksums, loss records; the callbacks' checked steps);
* **torch ops/step**: operator events the torch profiler records per optimizer step added
  by the tool (``aten::`` calls and their nested calls), the least step (deterministic, like
  the calls' least step): the tensor work that Python call counts do not see;
* **CPU µs/step**: ``--pairs`` alternating pairs (plain then tool, tool then plain), each
  timing ``--steps`` steps in process CPU time after ``--warm`` untimed steps of the
  installed tool; per pair the added CPU time per step and the ratio tool / plain;
  printed: median and interquartile range over the pairs. A pair shares the machine's
  load of its few hundred milliseconds, so the ratio of a pair is robust where two
  separate runs are not.

``--ledger``: the callbacks' collective ledger on vs off (``CheckedLedger`` replaced by a
no-op), both with the callbacks' checks, on the model wrapped in a 1-rank gloo DDP that
defers with ``no_sync`` (so the ledger books DDP's buckets at the checked windows).

``--profile TOOL``: the accumguard functions of that tool's steps by own time (cProfile),
to find where its per-step time goes.

Runs against any tree (``PYTHONPATH=<tree>/src``): the imports of b56c5f4's layout are
tried too.

    python benchmarks/bench_calls.py                       # all tools, 15 pairs
    python benchmarks/bench_calls.py --tools watch --pairs 41
    python benchmarks/bench_calls.py --ledger --pairs 41
    python benchmarks/bench_calls.py --profile watch
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from _work import python_calls

import accumguard
from accumguard.demo.toy import TinyCausalLM, count_tokens, make_lm_batches, token_loss

K = 4
EVERY_N = 10  # the callbacks' default: one step in 10 checked


def _recording() -> Callable[..., Any]:
    try:
        from accumguard.watch._recording import recording
    except ImportError:  # an older tree (b56c5f4) measured for comparison: its own layout
        import importlib

        old = importlib.import_module(".".join(("accumguard", "runtime", "watch")))
        return cast(Callable[..., Any], old.recording)
    return recording


class Setup:
    """The demo LM, its optimizer, scheduler and data (enough micro-batches for a run)."""

    def __init__(self, steps: int, ddp: bool = False) -> None:
        torch.manual_seed(0)
        model: torch.nn.Module = TinyCausalLM()
        self.head = model.head
        if ddp:
            model = torch.nn.parallel.DistributedDataParallel(model)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0)
        self.data = make_lm_batches(seed=0, world_size=1, micro_batches=K * steps,
                                    micro_batch_size=4, seq_len=32)[0]
        self.counts = [sum(float(count_tokens(b)) for b in self.data[i:i + K])
                       for i in range(0, len(self.data), K)]

    def train(self, steps: int) -> float:
        """``steps`` optimizer steps; returns their CPU time per step (seconds)."""
        model, opt, sched = self.model, self.opt, self.sched
        defer = getattr(model, "no_sync", None)
        n = len(self.counts)
        t0 = time.process_time()
        for s in range(steps):
            w = s % n
            for j in range(K):
                with defer() if defer is not None and j < K - 1 else contextlib.nullcontext():
                    (token_loss(model, self.data[w * K + j])[0] / self.counts[w]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
        return (time.process_time() - t0) / steps


@contextlib.contextmanager
def installed(tool: str, st: Setup, tmp: str) -> Iterator[None]:
    """The tool installed on ``st`` as the product installs it, removed on exit."""
    if tool == "watch":
        with _recording()(tempfile.mkdtemp(dir=tmp)):
            yield
        return
    if tool == "guard":
        from accumguard.runtime.guard import guard

        g = guard(st.model, st.opt, accumulation_steps=K, scheduler=st.sched).install()
        try:
            yield
        finally:
            g.close()
        return
    from accumguard.integrations._checks import AccumulationChecks

    checks = AccumulationChecks(st.model, st.opt, accumulation_steps=K, scheduler=st.sched,
                                logits_module=st.head, every_n_steps=EVERY_N)
    try:
        yield
    finally:
        checks.close()


@contextlib.contextmanager
def ledger_off() -> Iterator[None]:
    """The callbacks' checks without their collective ledger (a no-op in its place)."""
    from unittest import mock

    class NoLedger:
        def __init__(self, checks: object) -> None:
            self.last = None

    with mock.patch("accumguard.integrations._comm.CheckedLedger", NoLedger):
        yield


def _each_step(st: Setup, steps: int) -> list[int]:
    return [python_calls(lambda: st.train(1)) for _ in range(steps)]


def calls_per_step(tool: str, steps: int, warm: int) -> tuple[float, float, float, float]:
    """Python calls per step of the plain loop and of the loop under ``tool``: the mean over
    ``steps`` steps (sampled work included: conservation and loss records on a time budget,
    the callbacks' checked steps) and the least step (the per-event work alone, the same
    whatever the load)."""
    st = Setup(steps)
    st.train(warm)
    plain = _each_step(st, steps)
    with tempfile.TemporaryDirectory() as tmp, installed(tool, st, tmp):
        st.train(warm)
        tooled = _each_step(st, steps)
    return statistics.fmean(plain), statistics.fmean(tooled), min(plain), min(tooled)


def ops_per_step(tool: str, steps: int, warm: int) -> int:
    """Torch operator events per step added by ``tool``: its least step's minus the plain
    loop's least step's, over ``steps`` steps each (the sampled work is left out: the
    profiler slows every operator, which changes how often a time budget samples)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    def events(st: Setup) -> list[int]:
        out = []
        for _ in range(steps):
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                st.train(1)
            out.append(len(prof.events()))
        return out

    st = Setup(steps)
    st.train(warm)
    plain = events(st)
    with tempfile.TemporaryDirectory() as tmp, installed(tool, st, tmp):
        st.train(warm)
        tooled = events(st)
    return min(tooled) - min(plain)


def _q(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def paired(a: Callable[[], float], b: Callable[[], float], pairs: int
           ) -> tuple[list[float], list[float], list[float]]:
    """Alternating pairs of two timed runs: per pair ``b - a`` and ``b / a``, and ``a``."""
    diffs, ratios, base = [], [], []
    for i in range(pairs):
        if i % 2 == 0:
            x = a()
            y = b()
        else:
            y = b()
            x = a()
        diffs.append(y - x)
        ratios.append(y / x)
        base.append(x)
    return diffs, ratios, base


def timed(tool: str, steps: int, warm: int, pairs: int) -> tuple[list[float], ...]:
    st = Setup(steps)
    with tempfile.TemporaryDirectory() as tmp:
        def plain() -> float:
            return st.train(steps)

        def tooled() -> float:
            with installed(tool, st, tmp):
                st.train(warm)
                return st.train(steps)

        plain()
        tooled()  # warm-up of both paths
        return paired(plain, tooled, pairs)


class LedgerClock:
    """CPU time spent inside the ledger's own methods (CommLedger's backward listener,
    collective callback and take; CheckedLedger's step listener): the counting's cost
    measured directly, a few microseconds that the paired ratio cannot resolve."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.depth = 0
        self.on = False  # counting (the timed steps only)

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        from unittest import mock

        from accumguard.integrations._comm import CheckedLedger
        from accumguard.observe._comm_ledger import CommLedger

        def timed_method(fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                if self.depth or not self.on:
                    return fn(*args, **kwargs)
                self.depth += 1
                self.calls += 1
                t0 = time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.seconds += time.thread_time() - t0
                    self.depth -= 1
            return run

        with contextlib.ExitStack() as stack:
            for cls, name in ((CommLedger, "on_backward"), (CommLedger, "_ledger_collective"),
                              (CommLedger, "take"), (CheckedLedger, "on_step")):
                stack.enter_context(mock.patch.object(cls, name,
                                                      timed_method(getattr(cls, name))))
            yield


def ledger_timed(steps: int, warm: int, pairs: int, every: int
                 ) -> tuple[list[float], list[float], list[float], LedgerClock, int]:
    import torch.distributed as dist

    global EVERY_N
    EVERY_N = every
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 2000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        st = Setup(steps, ddp=True)
        with tempfile.TemporaryDirectory() as tmp:
            def run(off: bool) -> float:
                with ledger_off() if off else contextlib.nullcontext(), \
                        installed("callbacks", st, tmp):
                    st.train(warm)
                    return st.train(steps)

            def with_off() -> float:
                return run(True)

            def with_on() -> float:
                return run(False)

            with_off()
            with_on()
            d, r, base = paired(with_off, with_on, pairs)
            # the ledger's own CPU time, over runs like a pair's "on" half (timed steps only)
            clock = LedgerClock()
            n = max(3, pairs // 4)
            for _ in range(n):
                with clock.timing(), installed("callbacks", st, tmp):
                    st.train(warm)
                    clock.on = True
                    st.train(steps)
                    clock.on = False
            return d, r, base, clock, n
    finally:
        dist.destroy_process_group()


def profile(tool: str, steps: int, warm: int, top: int) -> None:
    st = Setup(steps)
    with tempfile.TemporaryDirectory() as tmp, installed(tool, st, tmp):
        st.train(warm)
        prof = cProfile.Profile()
        prof.enable()
        st.train(steps)
        prof.disable()
    stats = pstats.Stats(prof)
    root = os.path.dirname(accumguard.__file__)
    rows = []
    for (fn, line, name), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if fn.startswith(root):
            rows.append((tt, ct, nc, f"{os.path.relpath(fn, root)}:{line}({name})"))
    rows.sort(reverse=True)
    print(f"{tool}: accumguard functions by own time, per step over {steps} steps "
          f"(cProfile inflates absolute times)")
    print("own µs/step | cumulative µs/step | calls/step | function")
    for tt, ct, nc, where in rows[:top]:
        print(f"{1e6 * tt / steps:10.1f} | {1e6 * ct / steps:10.1f} | {nc / steps:6.1f} | {where}")
    print(f"total own time in accumguard: {1e6 * sum(r[0] for r in rows) / steps:.0f} µs/step, "
          f"{sum(r[2] for r in rows) / steps:.0f} calls/step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", default="watch,guard,callbacks")
    ap.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    ap.add_argument("--warm", type=int, default=4, help="untimed steps after installing")
    ap.add_argument("--pairs", type=int, default=15, help="alternating timed pairs")
    ap.add_argument("--ledger", action="store_true", help="callbacks: ledger on vs off")
    ap.add_argument("--every", type=int, default=EVERY_N,
                    help="--ledger: the callbacks' every_n_steps")
    ap.add_argument("--profile", default="", help="cProfile one tool's steps")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    head = (f"tree {os.path.dirname(os.path.dirname(os.path.dirname(accumguard.__file__)))}; "
            f"torch {torch.__version__}, 1 thread, K={K}, demo LM; load {os.getloadavg()[0]:.2f}")
    print(head)
    if args.profile:
        profile(args.profile, args.steps, args.warm, args.top)
        return
    if args.ledger:
        d, r, base, clock, runs = ledger_timed(args.steps, args.warm, args.pairs, args.every)
        lo, med, hi = _q(r)
        dlo, dmed, dhi = _q(d)
        plain = statistics.median(base)
        own = clock.seconds / (runs * args.steps)
        print(f"callbacks (1 step in {args.every} checked), 1-rank gloo DDP with no_sync, "
              f"{args.pairs} pairs x {args.steps} steps, process CPU time:")
        print(f"  without ledger {1e3 * plain:.2f} ms/step; ledger on/off "
              f"ratio median {med:.4f} (IQR {lo:.4f}-{hi:.4f}); added "
              f"{1e6 * dmed:.0f} µs/step (IQR {1e6 * dlo:.0f} to {1e6 * dhi:.0f})")
        print(f"  the ledger's own methods: {1e6 * own:.1f} CPU µs/step "
              f"({clock.calls / (runs * args.steps):.2f} calls/step, thread time over "
              f"{runs} runs) = {100 * own / plain:.3f} % of a step")
        print(f"load at the end {os.getloadavg()[0]:.2f}")
        return
    tools = args.tools.split(",")
    print(f"calls/step: Python calls per step added, after {args.warm} steps, over "
          f"{args.steps} (least step: per-event work; mean: with the sampled work); CPU: {args.pairs} "
          f"alternating pairs x {args.steps} steps")
    print("| tool | plain calls/step | added calls, least step | added calls, mean | "
          "added torch ops, least step | plain CPU ms/step | added CPU µs/step (median, IQR) | ratio (median, IQR) |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for tool in tools:
        plain_calls, tool_calls, plain_min, tool_min = calls_per_step(tool, args.steps,
                                                                      args.warm)
        ops = ops_per_step(tool, args.steps, args.warm)
        if args.pairs > 0:
            d, r, base = timed(tool, args.steps, args.warm, args.pairs)
            dlo, dmed, dhi = _q(d)
            lo, med, hi = _q(r)
            cpu = (f"{1e3 * statistics.median(base):.2f} | {1e6 * dmed:.0f} "
                   f"({1e6 * dlo:.0f} to {1e6 * dhi:.0f}) | {med:.3f} ({lo:.3f}-{hi:.3f})")
        else:
            cpu = "- | - | -"
        print(f"| {tool} | {plain_min:.0f} | {tool_min - plain_min:.0f} | "
              f"{tool_calls - plain_calls:.0f} | {ops} | {cpu} |",
              flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
