"""Overhead of the framework callbacks' checks per optimizer step, side by side.

Each callback (transformers ``AccumguardCallback``, Lightning ``AccumguardCallback``,
``accumguard.integrations.accelerate.watch``) installs the same thing:
``AccumulationChecks`` = the token-weight probe on the logits layer + the observation layer
(``accumguard.observe.Observer``: gradient-conservation checksums, step/zero_grad/scheduler/clip
events) + two tiny all-gathers per step on several ranks (not measured here: one process).
This times a plain accumulation loop (K micro-steps of forward + backward, then clip, AdamW
step, scheduler step, zero_grad) without and with the checks, alternating which goes first;
the ratio is the median over repetitions of checked / plain process CPU time (one thread). A
framework's own per-step work only adds to the denominator, so the plain loop is the worst case.

    python benchmarks/bench_integrations.py                 # markdown table
    python benchmarks/bench_integrations.py --reps 21 --steps 20 --models demo-lm
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

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


def _train(model: torch.nn.Module, opt: Any, sched: Any, data: list, k: int) -> None:
    # exact token normalisation: each window's summed loss over its token count N
    counts = [sum(float(count_tokens(b)) for b in data[i:i + k]) for i in range(0, len(data), k)]
    for i, batch in enumerate(data):
        (token_loss(model, batch)[0] / counts[i // k]).backward()
        if (i + 1) % k == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()


def _time(name: str, k: int, steps: int, variant: dict[str, Any] | None) -> float:
    model, opt, sched, data = _setup(name, k, steps)
    checks = None
    if variant is not None:
        checks = AccumulationChecks(model, opt, accumulation_steps=k, scheduler=sched,
                                    logits_module=model.head, **variant)
    t0 = time.process_time()
    _train(model, opt, sched, data, k)
    elapsed = time.process_time() - t0
    if checks is not None:
        checks.close()
        assert checks.findings == [], checks.findings  # an exact loop: nothing to report
    return elapsed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"K={args.k}, {args.steps} optimizer steps per timing, median of {args.reps} "
          "alternating repetitions, process CPU time, 1 thread\n")
    print("| model | plain ms/step | variant | checked ms/step | ratio |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        _time(name, args.k, 2, None)  # warm-up
        for vname, variant in VARIANTS.items():
            plain, checked, ratios = [], [], []
            for rep in range(args.reps):
                order = [None, variant] if rep % 2 == 0 else [variant, None]
                got = {id(v): _time(name, args.k, args.steps, v) for v in order}
                p, c = got[id(None)], got[id(variant)]
                plain.append(p)
                checked.append(c)
                ratios.append(c / p)
            ms = 1000 / args.steps
            print(f"| {name} | {statistics.median(plain) * ms:.2f} | {vname} | "
                  f"{statistics.median(checked) * ms:.2f} | {statistics.median(ratios):.3f} |")


if __name__ == "__main__":
    main()
