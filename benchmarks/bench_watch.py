"""Overhead of the observation layer (what ``accumguard watch`` installs in each rank) on
the demo model: the same accumulation loop with and without the observer, interleaved
(A/B/A/B...) so that machine noise hits both; prints the median per-step time ratio.

    python benchmarks/bench_watch.py [--steps 30] [--k 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from accumguard.demo.toy import TokenMLP, make_rank_batches, token_loss
from accumguard.observe import Observer


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, data: list, k: int,
           steps: int) -> float:
    t0 = time.perf_counter()
    for s in range(steps):
        for j in range(k):
            loss, _ = token_loss(model, data[(s * k + j) % len(data)])
            (loss / 100).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = make_rank_batches(seed=0, world_size=1, micro_batches=16)[0]
    _steps(model, opt, data, args.k, 3)  # warm-up
    plain, observed = [], []
    for _ in range(args.rounds):
        plain.append(_steps(model, opt, data, args.k, args.steps))
        with Observer(auto_roots=True, budget=0.03):  # as watch installs it
            observed.append(_steps(model, opt, data, args.k, args.steps))
    a, b = statistics.median(plain), statistics.median(observed)
    print(f"demo model, K={args.k}: plain {a * 1e3:.2f} ms/step, observed {b * 1e3:.2f} "
          f"ms/step, ratio {b / a:.3f} ({(b / a - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
