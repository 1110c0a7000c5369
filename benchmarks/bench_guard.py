"""Overhead of the runtime guard per optimizer step: guarded / unguarded, same loop, same run.

Each repetition runs ``--steps`` optimizer steps (K micro-steps each: forward, backward;
then clip, AdamW step, scheduler step, zero_grad) once without and once with
``accumguard.runtime.guard.guard(...)`` installed (on the observation layer), alternating
which goes first, and times every optimizer step (process CPU time). Reported, per model:

* steady state: mean step time with the guard over the steps after the first ``--warm``
  windows of each installation / mean step time without it over the same steps (a mean,
  so the windows whose conservation is checked within the budget count); median and
  IQR of that ratio over the repetitions. This is the cost per step of a long run:
  cheap checks on every event, gradient conservation sampled within its time budget
  (``CONSERVATION_BUDGET`` of the run's time);
* median step: median guarded step time / median unguarded step time over the same steps
  (robust to the neighbours' spikes, but blind to the sampled conservation windows: the
  per-event cost alone);
* whole run: install + the ``--steps`` guarded steps (the first two windows, whose
  conservation is always checked, included) + close / the unguarded run;
* windows checked per run and the share of the run's time the checks accounted for.

Single process, one thread, CPU: the guard's cost is Python work per event, so this is
its honest measure; on a shared machine expect a few percent of noise (IQR column).

    python benchmarks/bench_guard.py                    # all models, markdown table
    python benchmarks/bench_guard.py --reps 31 --steps 100 --models demo-lm
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
from _work import python_calls

from accumguard.demo.toy import (
    TinyCausalLM,
    TokenMLP,
    make_lm_batches,
    make_rank_batches,
    token_loss,
)
from accumguard.runtime.guard import guard

MODELS: dict[str, dict[str, Any]] = {
    # the toy of the test suite: 2.2 k parameters, 4x12 tokens per micro-batch
    "toy": {"model": {}, "data": {"micro_batch_size": 4, "seq_len": 12, "vocab": 32}},
    # 1.6 M parameters, 4x32 tokens per micro-batch
    "mlp-1.6M": {"model": {"vocab": 1024, "dim": 256, "hidden": 1024},
                 "data": {"micro_batch_size": 4, "seq_len": 32, "vocab": 1024}},
    # the demo's model: tiny causal transformer LM, 4x32 tokens per micro-batch
    "demo-lm": {"cls": TinyCausalLM, "batches": make_lm_batches, "model": {},
                "data": {"micro_batch_size": 4, "seq_len": 32}},
}


def _setup(name: str, k: int, steps: int) -> tuple[torch.nn.Module, Any, Any, list]:
    torch.manual_seed(0)
    spec = MODELS[name]
    model = spec.get("cls", TokenMLP)(**spec["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    make = spec.get("batches", make_rank_batches)
    data = make(seed=0, world_size=1, micro_batches=k * steps, **spec["data"])[0]
    return model, opt, sched, data


def _train(model: torch.nn.Module, opt: Any, sched: Any, data: list, k: int) -> list[float]:
    """The loop; returns the CPU time of each optimizer step (its K micro-steps included).
    CPU time of this process: on a shared machine wall time mostly measures the neighbours;
    the guard's cost is CPU work in this process, which this captures."""
    times = []
    t0 = time.process_time()
    for i, batch in enumerate(data):
        token_loss(model, batch)[0].backward()
        if (i + 1) % k == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            t1 = time.process_time()
            times.append(t1 - t0)
            t0 = t1
    return times


def _guarded(model: torch.nn.Module, opt: Any, sched: Any, data: list, k: int
             ) -> tuple[list[float], float, dict[str, float]]:
    """One guarded run: per-step CPU times, the CPU time of install + close, and what the
    guard's conservation checks did (windows checked, their accounted share of the run)."""
    t0 = time.process_time()
    g = guard(model, opt, accumulation_steps=k, scheduler=sched).install()
    install = time.process_time() - t0
    observer = g.observer
    out = _train(model, opt, sched, data, k)
    elapsed = time.perf_counter() - observer._t_start
    checks = {"checked": float(g.checked_windows),
              "share": observer._t_checks / elapsed if elapsed > 0 else 0.0}
    t0 = time.process_time()
    g.close()
    install += time.process_time() - t0
    assert not g.violations, g.violations
    return out, install, checks


def _calls_per_step(name: str, k: int, steps: int = 12, warm: int = 4) -> tuple[float, float]:
    """Python calls per optimizer step, plain and guarded (after ``warm`` windows, whose
    conservation checks are always made)."""
    model, opt, sched, data = _setup(name, k, steps)
    _train(model, opt, sched, data[:warm * k], k)  # both counted after warm-up steps
    plain = python_calls(lambda: _train(model, opt, sched, data[warm * k:], k))
    g = guard(model, opt, accumulation_steps=k, scheduler=sched).install()
    try:
        _train(model, opt, sched, data[:warm * k], k)
        guarded = python_calls(lambda: _train(model, opt, sched, data[warm * k:], k))
    finally:
        g.close()
    return plain / (steps - warm), guarded / (steps - warm)


def _iqr(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:  # one repetition: no spread to report
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def bench(name: str, *, k: int, steps: int, reps: int, warm: int) -> dict[str, Any]:
    model, opt, sched, data = _setup(name, k, steps)

    def plain() -> list[float]:
        return _train(model, opt, sched, data, k)

    plain()
    _guarded(model, opt, sched, data, k)  # warm-up both paths
    steady_plain: list[float] = []
    steady_guard: list[float] = []
    steady, per_step, whole, checked, share = [], [], [], [], []
    for rep in range(reps):
        if rep % 2 == 0:
            a = plain()
            b, install, chk = _guarded(model, opt, sched, data, k)
        else:
            b, install, chk = _guarded(model, opt, sched, data, k)
            a = plain()
        steady_plain += a[warm:]
        steady_guard += b[warm:]
        # mean, not median, over the steady steps: a window whose conservation is checked
        # is slower, and its cost belongs in the per-step price of a long run
        steady.append(statistics.fmean(b[warm:]) / statistics.fmean(a[warm:]))
        # robust to the neighbours' spikes, blind to the sampled checks: the per-event cost
        per_step.append(statistics.median(b[warm:]) / statistics.median(a[warm:]))
        whole.append((sum(b) + install) / sum(a))
        checked.append(chk["checked"])
        share.append(chk["share"])
    n_params = sum(p.numel() for p in model.parameters())
    return {"params": n_params, "plain_ms": 1e3 * statistics.fmean(steady_plain),
            "guard_ms": 1e3 * statistics.fmean(steady_guard),
            "ratio": statistics.median(steady), "iqr": _iqr(steady),
            "median_step": statistics.median(per_step), "median_step_iqr": _iqr(per_step),
            "whole": statistics.median(whole), "whole_iqr": _iqr(whole),
            "checked": statistics.fmean(checked), "share": statistics.median(share)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--k", type=int, default=4, help="accumulation steps")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per timing")
    parser.add_argument("--reps", type=int, default=15, help="interleaved repetitions")
    parser.add_argument("--warm", type=int, default=3,
                        help="windows after each install left out of the steady state")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, K={args.k}, {args.steps} optimizer steps per "
          f"timing, {args.reps} interleaved repetitions; load average {_load()}")
    print()
    print("| model | parameters | unguarded CPU ms/step | guarded CPU ms/step (steady) | "
          "steady guarded/unguarded (median) | IQR | median step guarded/unguarded | IQR | "
          "whole run incl. install (median) | IQR | windows checked per run | checks' share "
          "of the run |")
    print("|---|---:|---:|---:|---:|---|---:|---|---:|---|---:|---:|")
    for name in args.models:
        r = bench(name, k=args.k, steps=args.steps, reps=args.reps, warm=args.warm)
        print(f"| {name} | {r['params']:,} | {r['plain_ms']:.3f} | {r['guard_ms']:.3f} | "
              f"{r['ratio']:.3f}x | {r['iqr'][0]:.3f}-{r['iqr'][1]:.3f} | "
              f"{r['median_step']:.3f}x | {r['median_step_iqr'][0]:.3f}-"
              f"{r['median_step_iqr'][1]:.3f} | "
              f"{r['whole']:.3f}x | {r['whole_iqr'][0]:.3f}-{r['whole_iqr'][1]:.3f} | "
              f"{r['checked']:.1f} of {args.steps} | {100 * r['share']:.2f} % |", flush=True)
    print("\nWork added, counted (deterministic, whatever the load): Python calls per optimizer "
          "step in steady state")
    for name in args.models:
        plain, guarded = _calls_per_step(name, args.k)
        print(f"- {name}: plain loop {plain:.0f}, guarded {guarded:.0f} "
              f"(+{guarded - plain:.0f}, +{100 * (guarded - plain) / plain:.1f} %)")
    print(f"\nload average at the end {_load()}")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


if __name__ == "__main__":
    main()
