"""Overhead of what ``accumguard watch`` installs in each rank (the observation layer with
its recorder, :func:`accumguard.watch._recording.recording`) on the demo models: the same
accumulation loop with and without it, alternating which goes first, timed in process
CPU time (one thread: the cost is Python work per event, and CPU time is what a shared,
loaded machine measures least badly). Prints the median per-step time ratio per model.

Steady state: after installing, ``--warm`` steps run untimed (the first four windows' loss
records and the first two windows' conservation checks are always on, each such window
costs a fifth to a half of a step more; afterwards both are sampled within 0.5 % and 1 % of
the run's time). ``benchmarks/bench_watch_lockstep.py`` measures the same overhead with the
machine's drift taken out (two processes taking turns on one core).

    python benchmarks/bench_watch.py [--steps 20] [--k 4] [--reps 11] [--warm 4] [--models toy,demo-lm]
        [--run 400] [--run-reps 5] [--observe-steps 64]

Two figures per model. *While observing*: the cost per step of a window watch observes
(every window of a run observed with ``--observe-steps 0``; the first 64 of any run). *A run
of ``--run`` steps from the install*: the whole run, as ``accumguard watch`` installs it by
default (observed for its first ``--observe-steps`` steps, longer while the end of a first
DataLoader pass is in reach; the demo loop has none), against the same run plain, in the
same mirrored order: what a user's run of that length pays.

Each repetition times four runs of ``--steps`` steps in a mirrored order, plain, watched,
watched, plain (the next one watched, plain, plain, watched): a load that drifts steadily
through the repetition (this machine's CPU time per step wanders by ±25 % over seconds)
weighs on both sides equally, which a pair does not. Garbage is collected, untimed, before
each timed run (neither side pays for the other's). The ratio of a repetition is watched
over plain, summed; the median of the ratios and their interquartile range are printed.
``benchmarks/bench_calls.py`` gives pairs for watch, the guard and the callbacks, with
Python calls per step.

``--ledger``: side by side, ``watch`` with the collective ledger against ``watch`` with the
ledger switched off, on the model wrapped in a 1-rank gloo DDP deferring with ``no_sync``
(so DDP's bucket booking runs at every window's last backward): the ledger's own cost.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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
from accumguard.watch._recording import OBSERVE_STEPS

MODELS: dict[str, Any] = {
    "toy": (TokenMLP, lambda: make_rank_batches(seed=0, world_size=1, micro_batches=16)[0]),
    "demo-lm": (TinyCausalLM, lambda: make_lm_batches(seed=0, world_size=1, micro_batches=16,
                                                      micro_batch_size=4, seq_len=32)[0]),
}


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, data: list, k: int,
           steps: int) -> float:
    t0 = time.process_time()
    defer = getattr(model, "no_sync", None)
    for s in range(steps):
        for j in range(k):
            with defer() if defer is not None and j < k - 1 else contextlib.nullcontext():
                loss, _ = token_loss(model, data[(s * k + j) % len(data)])
                (loss / 100).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return (time.process_time() - t0) / steps


def _iqr(xs: list[float]) -> str:
    """The interquartile range of the per-pair ratios (the spread the median hides)."""
    if len(xs) < 2:
        return "-"
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.3f}-{q[2]:.3f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--warm", type=int, default=4,
                   help="untimed optimizer steps after installing (steady state)")
    p.add_argument("--run", type=int, default=400, metavar="N",
                   help="also time a whole run of N steps from the install with watch's "
                        "default observation (0: skip)")
    p.add_argument("--run-reps", type=int, default=5)
    p.add_argument("--observe-steps", type=int, default=OBSERVE_STEPS)
    p.add_argument("--ledger", action="store_true",
                   help="watch with vs without the collective ledger, on 1-rank gloo DDP")
    args = p.parse_args()
    torch.set_num_threads(1)
    from accumguard.watch._recording import recording
    if args.ledger:
        _ledger_side_by_side(args)
        return
    print(f"load average {os.getloadavg()[0]:.1f}; K={args.k}, {args.steps} steps per timing, "
          f"median of {args.reps} mirrored repetitions (P WW P / W PP W), process CPU time")
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
                got: dict[str, list[float]] = {"plain": [], "watch": []}
                order = ("plain", "watch", "plain") if rep % 2 == 0 else \
                    ("watch", "plain", "watch")
                for i, which in enumerate(order):
                    runs = 1 if i != 1 else 2  # the middle one twice: P WW P or W PP W
                    if which == "plain":
                        for _ in range(runs):
                            gc.collect()
                            got[which].append(_steps(model, opt, data, args.k, args.steps))
                    else:
                        with recording(os.path.join(tmp, f"{rep}-{i}")):  # as watch installs it
                            # steady state: the first windows (conservation always checked)
                            # are untimed, as in bench_guard.py
                            _steps(model, opt, data, args.k, args.warm)
                            for _ in range(runs):
                                gc.collect()
                                got[which].append(_steps(model, opt, data, args.k, args.steps))
                plain.append(statistics.mean(got["plain"]))
                observed.append(statistics.mean(got["watch"]))
                ratios.append(sum(got["watch"]) / sum(got["plain"]))
        a, b = statistics.median(plain), statistics.median(observed)
        print(f"{name}, K={args.k}, while observing: plain {a * 1e3:.2f} ms/step, watch "
              f"{b * 1e3:.2f} ms/step, ratio {statistics.median(ratios):.3f} (IQR "
              f"{_iqr(ratios)} over the repetitions)")
        if args.run:
            _whole_run(name, model, opt, data, args)


def _whole_run(name: str, model: torch.nn.Module, opt: torch.optim.Optimizer, data: list,
               args: argparse.Namespace) -> None:
    """A whole run of ``--run`` steps from the install, watched as ``accumguard watch``
    installs it (``--observe-steps``: observed for its first steps, then nothing of
    accumguard in it), against the same run plain; mirrored order as above."""
    from accumguard.watch._recording import recording

    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.run_reps):
            got: dict[str, list[float]] = {"plain": [], "watch": []}
            order = ("plain", "watch", "watch", "plain") if rep % 2 == 0 else \
                ("watch", "plain", "plain", "watch")
            for i, which in enumerate(order):
                gc.collect()
                if which == "plain":
                    got[which].append(_steps(model, opt, data, args.k, args.run))
                else:
                    with recording(os.path.join(tmp, f"run-{rep}-{i}"),
                                   observe_steps=args.observe_steps):
                        got[which].append(_steps(model, opt, data, args.k, args.run))
            ratios.append(sum(got["watch"]) / sum(got["plain"]))
    print(f"{name}, K={args.k}, a run of {args.run} steps from the install (observed for the "
          f"first {args.observe_steps}): ratio {statistics.median(ratios):.3f} (IQR "
          f"{_iqr(ratios)} over {args.run_reps} repetitions)")


def _ledger_side_by_side(args: argparse.Namespace) -> None:
    """The ledger's cost: the same watched DDP loop with the ledger and with it off."""
    from unittest import mock

    import torch.distributed as dist

    from accumguard.observe._comm_ledger import CommLedger
    from accumguard.watch._recording import recording

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29671")
    dist.init_process_group("gloo", rank=0, world_size=1)
    off = [mock.patch.object(CommLedger, "attach", lambda self: None),
           mock.patch.object(CommLedger, "on_backward", lambda self, ev: None),
           mock.patch.object(CommLedger, "take", lambda self: {})]
    print(f"load average {os.getloadavg()[0]:.1f}; K={args.k}, {args.steps} steps per timing, "
          f"median of {args.reps} alternating repetitions, process CPU time; 1-rank gloo DDP")
    try:
        for name in args.models.split(","):
            cls, data_fn = MODELS[name]
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(cls())
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            data = data_fn()
            _steps(model, opt, data, args.k, 3)
            got: dict[str, list[float]] = {"ledger": [], "off": []}
            ratios = []
            with tempfile.TemporaryDirectory() as tmp:
                for rep in range(args.reps):
                    one = {}
                    for which in (("off", "ledger") if rep % 2 == 0 else ("ledger", "off")):
                        with contextlib.ExitStack() as stack:
                            if which == "off":
                                for patch in off:
                                    stack.enter_context(patch)
                            stack.enter_context(recording(os.path.join(tmp, f"{rep}{which}")))
                            _steps(model, opt, data, args.k, args.warm)
                            one[which] = _steps(model, opt, data, args.k, args.steps)
                    for w in one:
                        got[w].append(one[w])
                    ratios.append(one["ledger"] / one["off"])
            print(f"{name}, K={args.k}: watch without ledger "
                  f"{statistics.median(got['off']) * 1e3:.2f} ms/step, with ledger "
                  f"{statistics.median(got['ledger']) * 1e3:.2f} ms/step, ratio "
                  f"{statistics.median(ratios):.3f} (IQR {_iqr(ratios)})")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
