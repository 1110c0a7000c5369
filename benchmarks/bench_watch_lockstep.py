"""watch's overhead on the demo LM measured in lockstep: a plain and a watched process share
one CPU core and take turns, window by window (``--turn``), each timing its own windows in
process CPU time. Both sides see the same machine at the same moment, so the drift that
makes two separate timings on a shared machine differ by ±25 % (and a pair of them by
±10 %) falls out of the ratio; ``--aa`` runs plain against plain to show the method's own
bias and spread (about 1.000 ± 0.01 here).

    python benchmarks/bench_watch_lockstep.py [--windows 600] [--warm 10] [--turn 1]
        [--core 0] [--aa] [--no-budgets] [--observe-steps N]

Prints the ratio of the summed CPU times (watched / plain), the mean of the per-window
ratios with a bootstrap 95 % interval, and the added CPU µs per timed window by phase
(forward, loss, backward, clip, optimizer step, zero_grad).

Two things to know when reading it. The sampled work (conservation checks, loss records)
runs on budgets of the run's *wall* time; in lockstep each process waits half of it, so
the sampled work counts about twice what it does in a run alone (``--no-budgets`` leaves
it out and measures the per-event work alone). And ``--turn 1`` hands the core over after
every window, so each window starts on caches the other process used; ``--turn 10`` keeps
them for ten windows.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

_BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
PHASES = ("fwd", "loss", "bwd", "clip", "step", "zero")


def _worker(which: str, mine: Any, theirs: Any, args: argparse.Namespace, out: Any) -> None:
    """One side: build the demo LM, run ``warm + windows`` windows, a turn at a time."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {args.core})
    sys.path.insert(0, _BENCH_DIR)
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own alias
    from bench_watch import MODELS  # type: ignore[import-not-found]

    from accumguard.demo.toy import IGNORE_INDEX

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cls, data_fn = MODELS["demo-lm"]
    model = cls()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = data_fn()
    spent: collections.Counter[str] = collections.Counter()
    clock = time.process_time

    def window(s: int) -> float:
        t0 = c = clock()
        for j in range(args.k):
            batch = data[(s * args.k + j) % len(data)]
            a = clock()
            logits = model(batch["tokens"])
            b = clock()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   batch["labels"].reshape(-1), ignore_index=IGNORE_INDEX,
                                   reduction="sum")
            c = clock()
            (loss / 100).backward()
            d = clock()
            spent["fwd"] += b - a
            spent["loss"] += c - b
            spent["bwd"] += d - c
            c = d
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        a = clock()
        opt.step()
        b = clock()
        opt.zero_grad()
        d = clock()
        spent["clip"] += a - c
        spent["step"] += b - a
        spent["zero"] += d - b
        return d - t0

    for s in range(3):  # the same untimed start on both sides, before any install
        window(s)
    ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    tmp = tempfile.mkdtemp(prefix="accumguard-lockstep-")  # the recording; removed at the end
    if which == "watch":
        if args.no_budgets:
            import accumguard.observe._losses as losses
            import accumguard.observe._profiles as profiles
            profiles.WATCH_BUDGET = 0.0  # type: ignore[misc]
            losses._BUDGET = 0.0  # type: ignore[misc]
        from accumguard.watch._recording import recording
        ctx = recording(os.path.join(tmp, "rec"), observe_steps=args.observe_steps or None)
    spent.clear()
    times: list[float] = []
    total = args.warm + args.windows
    with ctx:
        for s in range(total):
            if s % args.turn == 0 and not mine.acquire(timeout=600):
                raise TimeoutError(f"{which}: the other side did not hand over in 600 s")
            t = window(s)
            if s % args.turn == args.turn - 1 or s == total - 1:
                theirs.release()
            if s >= args.warm:
                times.append(t)
            else:
                spent.clear()  # the phases of the timed windows only
    shutil.rmtree(tmp, ignore_errors=True)
    out.put((which, times, {k: v / args.windows for k, v in spent.items()}))


def _ci(xs: list[float], rounds: int = 2000) -> tuple[float, float]:
    """Bootstrap 95 % interval of the mean."""
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(xs, k=len(xs))) for _ in range(rounds))
    return means[int(0.025 * rounds)], means[int(0.975 * rounds)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=600)
    p.add_argument("--warm", type=int, default=10,
                   help="untimed windows after the install (the first windows' always-on "
                        "checks and loss records)")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--turn", type=int, default=1, help="windows per turn")
    p.add_argument("--core", type=int, default=0)
    p.add_argument("--aa", action="store_true", help="plain against plain (calibration)")
    p.add_argument("--observe-steps", type=int, default=0, metavar="N",
                   help="watch observes the first N windows after the install, as the CLI "
                        "does by default with 64 (0: every window)")
    p.add_argument("--no-budgets", action="store_true",
                   help="switch watch's sampled work off (per-event work only)")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    first, second = ctx.Semaphore(0), ctx.Semaphore(0)
    out = ctx.Queue()
    b_side = "plain2" if args.aa else "watch"
    procs = [ctx.Process(target=_worker, args=("plain", first, second, args, out)),
             ctx.Process(target=_worker, args=(b_side, second, first, args, out))]
    for proc in procs:
        proc.start()
    first.release()
    got = {}
    for _ in procs:
        which, times, spent = out.get(timeout=3600)
        got[which] = (times, spent)
    for proc in procs:
        proc.join(timeout=60)
    (pa, sa), (pb, sb) = got["plain"], got[b_side]
    ratios = [b / a for a, b in zip(pa, pb, strict=True)]
    lo, hi = _ci(ratios)
    load = os.getloadavg()[0]
    print(f"demo LM, K={args.k}, {args.windows} windows a side after {args.warm} untimed, "
          f"turns of {args.turn}, core {args.core}, load {load:.1f}; {b_side} vs plain"
          + (" (sampled work off)" if args.no_budgets and not args.aa else ""))
    print(f"plain {statistics.fmean(pa) * 1e3:.2f} ms, {b_side} {statistics.fmean(pb) * 1e3:.2f}"
          f" ms per window; ratio of sums {sum(pb) / sum(pa):.4f}; mean of window ratios "
          f"{statistics.fmean(ratios):.4f} (95 % CI {lo:.4f}-{hi:.4f})")
    print("added CPU µs per window: " + ", ".join(
        f"{k} {(sb.get(k, 0.0) - sa.get(k, 0.0)) * 1e6:+.0f}" for k in PHASES))


if __name__ == "__main__":
    main()
