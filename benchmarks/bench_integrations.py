"""Overhead of the framework callbacks' checks per optimizer step, side by side.

Each callback (transformers ``AccumguardCallback``, Lightning ``AccumguardCallback``,
``accumguard.integrations.accelerate.watch``) installs the same thing:
``AccumulationChecks`` = the token-weight probe on the logits layer + the observation layer
(``accumguard.observe.Observer``: gradient-conservation checksums, step/zero_grad/scheduler/clip
events) + two tiny all-gathers per step on several ranks (not measured here: one process).
This times a plain accumulation loop (K micro-steps of forward + backward, then clip, AdamW
step, scheduler step, zero_grad) without and with the checks, alternating which goes first,
and times every optimizer step (process CPU time, one thread). Reported: the steady state
(mean step time after the first ``--warm`` steps, checked / plain, so the sampled steps count
at their cost; median and IQR over repetitions), the median step ratio (robust to the
neighbours' spikes, blind to the sampled steps) and the whole run (install, the first steps,
close). A framework's own per-step work only adds to the denominator, so the plain loop is
the worst case.

    python benchmarks/bench_integrations.py                 # markdown table
    python benchmarks/bench_integrations.py --reps 21 --steps 100 --models demo-lm
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
from _work import python_calls

from accumguard.demo.toy import TinyCausalLM, count_tokens, make_lm_batches, token_loss
from accumguard.integrations._checks import AccumulationChecks

MODELS: dict[str, dict[str, Any]] = {
    # the demo's model: tiny causal transformer LM (0.2 M parameters), 4x32 tokens per micro-batch
    "demo-lm": {"model": {}, "data": {"micro_batch_size": 4, "seq_len": 32}},
    # a wider one: 4 layers, dim 256, vocab 4096 (about 4.3 M parameters), 8x32 tokens
    "lm-4M": {"model": {"vocab": 4096, "dim": 256, "layers": 4, "hidden": 1024},
              "data": {"micro_batch_size": 8, "seq_len": 32, "vocab": 4096}},
}

VARIANTS = {
    "checks, 1 step in 10 (default)": {"observe": True, "every_n_steps": 10},
    "checks, every step": {"observe": True, "every_n_steps": 1},
    "probe only, every step": {"observe": False, "every_n_steps": 1},
    "probe only, 1 step in 10": {"observe": False, "every_n_steps": 10},
}


def _setup(name: str, k: int, steps: int) -> tuple[torch.nn.Module, Any, Any, list]:
    torch.manual_seed(0)
    spec = MODELS[name]
    model = TinyCausalLM(**spec["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    data = make_lm_batches(seed=0, world_size=1, micro_batches=k * steps, **spec["data"])[0]
    return model, opt, sched, data


def _train(model: torch.nn.Module, opt: Any, sched: Any, data: list, k: int) -> list[float]:
    """The loop; returns the CPU time of each optimizer step (its K micro-steps included)."""
    # exact token normalisation: each window's summed loss over its token count N
    counts = [sum(float(count_tokens(b)) for b in data[i:i + k]) for i in range(0, len(data), k)]
    times = []
    t0 = time.process_time()
    for i, batch in enumerate(data):
        (token_loss(model, batch)[0] / counts[i // k]).backward()
        if (i + 1) % k == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            t1 = time.process_time()
            times.append(t1 - t0)
            t0 = t1
    return times


def _time(name: str, k: int, steps: int, variant: dict[str, Any] | None
          ) -> tuple[list[float], float]:
    """Per-step CPU times of one run and the CPU time of install + close (0 when plain)."""
    model, opt, sched, data = _setup(name, k, steps)
    checks = None
    install = 0.0
    if variant is not None:
        t0 = time.process_time()
        checks = AccumulationChecks(model, opt, accumulation_steps=k, scheduler=sched,
                                    logits_module=model.head, **variant)
        install = time.process_time() - t0
    times = _train(model, opt, sched, data, k)
    if checks is not None:
        t0 = time.process_time()
        checks.close()
        install += time.process_time() - t0
        assert checks.findings == [], checks.findings  # an exact loop: nothing to report
    return times, install


def _calls_per_step(name: str, k: int, variant: dict[str, Any], steps: int = 24,
                    warm: int = 4) -> tuple[float, float]:
    """Python calls per optimizer step of the plain loop and of the checked one (after
    ``warm`` steps; over ``steps - warm`` steps, so sampled steps count at their share)."""
    model, opt, sched, data = _setup(name, k, steps)
    _train(model, opt, sched, data[:warm * k], k)  # both counted after warm-up steps
    plain = python_calls(lambda: _train(model, opt, sched, data[warm * k:], k))
    checks = AccumulationChecks(model, opt, accumulation_steps=k, scheduler=sched,
                                logits_module=model.head, **variant)
    try:
        _train(model, opt, sched, data[:warm * k], k)
        checked = python_calls(lambda: _train(model, opt, sched, data[warm * k:], k))
    finally:
        checks.close()
    return plain / (steps - warm), checked / (steps - warm)


def _iqr(xs: list[float]) -> str:
    if len(xs) < 2:  # one repetition: no spread to report
        return "-"
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.3f}-{q[2]:.3f}"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default="",
                    help="comma-separated substrings of variant names to run (default: all)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--warm", type=int, default=3,
                    help="steps after install left out of the steady state")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    wanted = [v for v in args.variants.split(",") if v]
    variants = {n: v for n, v in VARIANTS.items() if not wanted or any(w in n for w in wanted)}
    print(f"K={args.k}, {args.steps} optimizer steps per timing, median of {args.reps} "
          f"alternating repetitions, process CPU time, 1 thread; load average {_load()}\n")
    print("| model | plain ms/step | variant | checked ms/step (steady) | steady ratio (median) "
          "| IQR | median step ratio | IQR | whole run incl. install (median) | IQR |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    w = args.warm
    for name in args.models.split(","):
        _time(name, args.k, 2, None)  # warm-up
        for vname, variant in variants.items():
            plain, checked, steady, per_step, whole = [], [], [], [], []
            for rep in range(args.reps):
                order = [None, variant] if rep % 2 == 0 else [variant, None]
                got = {id(v): _time(name, args.k, args.steps, v) for v in order}
                (p, _), (c, install) = got[id(None)], got[id(variant)]
                plain += p[w:]
                checked += c[w:]
                # means over the steady steps: the sampled (checked) steps count at their cost
                steady.append(statistics.fmean(c[w:]) / statistics.fmean(p[w:]))
                # robust to spikes, blind to the sampled steps: the per-event cost
                per_step.append(statistics.median(c[w:]) / statistics.median(p[w:]))
                whole.append((sum(c) + install) / sum(p))
            print(f"| {name} | {statistics.fmean(plain) * 1e3:.2f} | {vname} | "
                  f"{statistics.fmean(checked) * 1e3:.2f} | {statistics.median(steady):.3f} | "
                  f"{_iqr(steady)} | {statistics.median(per_step):.3f} | {_iqr(per_step)} | "
                  f"{statistics.median(whole):.3f} | {_iqr(whole)} |",
                  flush=True)
    print("\nWork added, counted (deterministic, whatever the load): Python calls per optimizer "
          "step after 4 steps, over 20")
    for name in args.models.split(","):
        for vname, variant in variants.items():
            plain_calls, checked_calls = _calls_per_step(name, args.k, variant)
            print(f"- {name}, {vname}: plain loop {plain_calls:.0f}, checked "
                  f"{checked_calls:.0f} (+{checked_calls - plain_calls:.0f}, "
                  f"+{100 * (checked_calls - plain_calls) / plain_calls:.1f} %)")
    print(f"\nload average at the end {_load()}")


if __name__ == "__main__":
    main()
