"""Overhead of the runtime guard per optimizer step: guarded / unguarded, same loop, same run.

Each repetition runs ``--steps`` optimizer steps (K micro-steps each: forward, backward;
then clip, AdamW step, scheduler step, zero_grad) once without and once with
``accumguard.runtime.guard.guard(...)`` installed (on the observation layer), alternating
which goes first, and times every optimizer step (process CPU time). Reported, per model:

* steady state: median step time with the guard, over the steps after the first
  ``--warm`` windows of each installation, / median step time without it. This is the
  cost per step of a long run: cheap checks on every event, gradient conservation
  sampled within its time budget (``CONSERVATION_BUDGET`` of the run's time);
* whole run: total time of the ``--steps`` guarded steps (install, the first two windows
  whose conservation is always checked, close) / total unguarded time.

Single process, one thread, CPU: the guard's cost is Python work per event, so this is
its honest measure; on a shared machine expect a few percent of noise (IQR column).

    python benchmarks/bench_guard.py                    # all models, markdown table
    python benchmarks/bench_guard.py --reps 31 --steps 30 --models toy
"""

from __future__ import annotations

import argparse
import statistics
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


def bench(name: str, *, k: int, steps: int, reps: int, warm: int) -> dict[str, float]:
    model, opt, sched, data = _setup(name, k, steps)

    def plain() -> list[float]:
        return _train(model, opt, sched, data, k)

    def guarded() -> list[float]:
        with guard(model, opt, accumulation_steps=k, scheduler=sched) as g:
            out = _train(model, opt, sched, data, k)
        assert not g.violations, g.violations
        return out

    plain()
    guarded()  # warm-up both paths
    steady_plain: list[float] = []
    steady_guard: list[float] = []
    ratios, whole = [], []
    for rep in range(reps):
        if rep % 2 == 0:
            a, b = plain(), guarded()
        else:
            b, a = guarded(), plain()
        steady_plain += a[warm:]
        steady_guard += b[warm:]
        ratios.append(statistics.median(b[warm:]) / statistics.median(a[warm:]))
        whole.append(sum(b) / sum(a))
    n_params = sum(p.numel() for p in model.parameters())
    return {"params": n_params, "plain_ms": 1e3 * statistics.median(steady_plain),
            "guard_ms": 1e3 * statistics.median(steady_guard),
            "ratio": statistics.median(ratios),
            "ratio_q1": statistics.quantiles(ratios, n=4)[0],
            "ratio_q3": statistics.quantiles(ratios, n=4)[2],
            "whole": statistics.median(whole)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--k", type=int, default=4, help="accumulation steps")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per timing")
    parser.add_argument("--reps", type=int, default=21, help="interleaved repetitions")
    parser.add_argument("--warm", type=int, default=3,
                        help="windows after each install left out of the steady state")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, K={args.k}, {args.steps} optimizer steps per "
          f"timing, {args.reps} interleaved repetitions, median")
    print()
    print("| model | parameters | unguarded CPU ms/step | guarded CPU ms/step (steady) | "
          "steady guarded/unguarded (median) | IQR of the ratio | whole run incl. install |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for name in args.models:
        r = bench(name, k=args.k, steps=args.steps, reps=args.reps, warm=args.warm)
        print(f"| {name} | {r['params']:,} | {r['plain_ms']:.3f} | {r['guard_ms']:.3f} | "
              f"{r['ratio']:.3f}x | {r['ratio_q1']:.3f}-{r['ratio_q3']:.3f} | "
              f"{r['whole']:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
