"""Paired measurement of ``accumguard bench --paired``: deciding a bar on a noisy machine.

Every configuration's step runs between two steps of the limit; the per-round ratios
give a median, its interquartile range and a bootstrap interval, and a verdict per bar.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import torch

from accumguard.demo._bench_setup import (
    _setup_worker,
    _timed_step,
    configurations,
    make_batches,
    make_model,
)

# -- paired measurement: deciding a bar on a noisy machine ------------------------------------
# The bars of issues 13 and 27 (× the limit), by configuration name.
BARS: dict[str, float] = {
    "DDP deferred": 1.05,
    "DeepSpeed ZeRO-2 deferred (coalesced)": 1.2,
    "DeepSpeed ZeRO-2 deferred (coalesced), contiguous_gradients false": 1.2,
    "FSDP2 deferred, window_memory=unsharded": 1.3,
    "DeepSpeed ZeRO-3 deferred (coalesced), window_memory=unsharded": 1.3,
}
LIMIT = "limit (compute + 1 all-reduce)"


def paired_worker(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration measured one optimizer step at a time, each step of a
    configuration C between two steps of the limit L (L C1 L C2 L ... L, the order of the
    Cs reversed every round): C's ratio in a round is its time over the mean of the two L
    steps next to it, so slow phases of the machine (seconds to minutes) hit both sides of
    the ratio alike."""
    if not args.no_deepspeed:
        _setup_worker()
    torch.manual_seed(0)
    builders = configurations(args)
    k = args.k
    batches = make_batches(rank, k, args.micro, args.dim)
    runs = {}
    for name, build in builders.items():
        runs[name] = build()
        for _ in range(args.warm):  # allocates gradients, optimizer state, buckets
            runs[name](batches)
    others = [n for n in runs if n != LIMIT]
    samples: dict[str, list[list[float]]] = {n: [] for n in others}
    for r in range(args.rounds):
        order = others if r % 2 == 0 else others[::-1]
        prev = _timed_step(runs[LIMIT], batches)
        for name in order:
            cur = _timed_step(runs[name], batches)
            nxt = _timed_step(runs[LIMIT], batches)
            # wall C, wall L before, wall L after, cpu C, cpu L before, cpu L after
            samples[name].append([cur[0], prev[0], nxt[0], cur[1], prev[1], nxt[1]])
            prev = nxt
    return {"samples": samples, "load": os.getloadavg()[0],
            "params": sum(p.numel() for p in make_model(args.dim, args.hidden).parameters())}


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def bootstrap_ci(values: list[float], *, resamples: int = 4000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (seeded: the same data give the same
    interval)."""
    import random

    rng = random.Random(seed)
    n = len(values)
    meds = sorted(_median([values[rng.randrange(n)] for _ in range(n)])
                  for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * (resamples - 1))]
    hi = meds[int((1 + level) / 2 * (resamples - 1))]
    return lo, hi


def verdict(ci: tuple[float, float], bar: float | None) -> str:
    """"met" when the whole interval is at or under the bar, "not met" when it is wholly
    over it, "undecidable" when it straddles the bar (this run cannot tell)."""
    if bar is None:
        return "-"
    if ci[1] <= bar:
        return "met"
    if ci[0] > bar:
        return "not met"
    return "undecidable"


def paired_summary(samples: dict[str, list[list[float]]],
                   bars: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Per configuration: the per-round ratios to the adjacent limit steps (wall and CPU),
    their median, interquartile range, 95 % bootstrap interval of the median, and the
    verdict against its bar: by wall time (what the bar is about) and by CPU time (the
    work; decidable on a shared machine where wall time is mostly the neighbours)."""
    bars = BARS if bars is None else bars
    rows = []
    for name, rounds in samples.items():
        wall = [c / ((a + b) / 2) for c, a, b, *_ in rounds]
        cpu = [c / ((a + b) / 2) for *_, c, a, b in rounds]
        q = statistics.quantiles(wall, n=4) if len(wall) > 1 else [wall[0]] * 3
        ci = bootstrap_ci(wall)
        rows.append({
            "configuration": name, "rounds": len(rounds),
            "seconds": _median([x[0] for x in rounds]),
            "limit_seconds": _median([(x[1] + x[2]) / 2 for x in rounds]),
            "ratio": _median(wall), "iqr": (q[0], q[2]), "ci95": ci,
            "cpu_ratio": _median(cpu), "cpu_ci95": bootstrap_ci(cpu),
            "bar": bars.get(name), "verdict": verdict(ci, bars.get(name)),
            "cpu_verdict": verdict(bootstrap_ci(cpu), bars.get(name))})
    return rows


def paired_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| configuration | s / step (median) | limit s / step (adjacent, median) | "
             "× limit (median of per-round ratios) | IQR | 95 % CI of the median | "
             "CPU-time × limit (95 % CI) | bar | verdict (wall) | verdict (CPU time) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bar = "-" if r["bar"] is None else f"≤ {r['bar']:g}"
        lines.append(
            f"| {r['configuration']} | {r['seconds']:.3f} | {r['limit_seconds']:.3f} | "
            f"{r['ratio']:.3f} | {r['iqr'][0]:.3f}-{r['iqr'][1]:.3f} | "
            f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f} | {r['cpu_ratio']:.3f} "
            f"({r['cpu_ci95'][0]:.3f}-{r['cpu_ci95'][1]:.3f}) | {bar} | {r['verdict']} | "
            f"{r['cpu_verdict']} |")
    return "\n".join(lines)
