"""Seconds per optimizer step of every engine adapter, side by side, on 2 gloo ranks.

What is measured (one spawn, every configuration built once, then measured in
interleaved rounds so a noisy machine slows all of them alike; the median over
rounds is reported):

* ``local``: compute only — K forward+backward passes and an optimizer step on
  each rank independently, no communication;
* ``limit``: the same compute plus ONE all-reduce of a flat fp32 buffer the size
  of all gradients: what a perfectly deferred data-parallel step costs;
* the Accumulator on DDP (deferred / eager), FSDP2 (if ``accumguard.engines.fsdp2``
  exists; deferred / eager), DeepSpeed ZeRO 1/2/3 ``eager`` (config GA = K, the
  engine's native reduction) and ``deferred`` (config GA = 1 +
  ``coalesce_grad_reduction``).

Peak memory: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` is a process-lifetime
peak, so in the shared run it is reported once per rank; ``--isolated-memory``
runs every configuration in its own spawn (slower) to get a peak per
configuration.

``--paired`` decides the bars on a noisy machine: every configuration runs one optimizer
step at a time between two steps of the limit (L C1 L C2 L ...), its ratio in a round is
taken against those two adjacent limit steps, and the report gives the median ratio with
its interquartile range and a bootstrap 95 % interval: "met" / "not met" when the whole
interval is on one side of the bar, "undecidable" otherwise. CPU time (summed over ranks)
is reported beside wall time: it is the work done, which neighbours disturb much less.

``--zero-study 3`` (or 2) runs DeepSpeed variants (native GA vs coalesced, and the
engine's memory/communication knobs) each in its own spawn: parameter all-gathers and
gradient reductions per step (counted at DeepSpeed's comm backend), seconds paired with
the limit, RSS after build and the peak RSS over a step.

The modes live beside this module: the shared model, configurations and timing in
``_bench_setup``, the paired statistics in ``_bench_paired``, the ZeRO study in
``_bench_zero``, the precision table in ``_bench_precision``; their names are importable
from here.

Usage::

    python benchmarks/bench_engines.py            # full: 7 rounds x 2 steps
    python benchmarks/bench_engines.py --quick    # 3 rounds x 1 step, for a smoke check
    accumguard bench --paired --rounds 30 --only "DDP deferred" "ZeRO-2 deferred"
    accumguard bench --zero-study 3 --rounds 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any

import torch

from accumguard.demo._bench_paired import (
    BARS,
    LIMIT,
    bootstrap_ci,
    paired_summary,
    paired_table,
    paired_worker,
    verdict,
)
from accumguard.demo._bench_precision import precision_rows, precision_table
from accumguard.demo._bench_setup import (
    DS_STAGES,
    Run,
    _setup_worker,
    _timed,
    configurations,
    make_batches,
    make_model,
    peak_rss_mb,
    rss_mb,
    sum_loss,
)

# Private helpers the tests drive directly, importable from here as before the split.
from accumguard.demo._bench_setup import _build_ddp as _build_ddp
from accumguard.demo._bench_setup import _build_local as _build_local
from accumguard.demo._bench_zero import (
    ZERO2_VARIANTS,
    ZERO3_VARIANTS,
    zero_study,
    zero_study_worker,
    zero_table,
)
from accumguard.demo._bench_zero import _counting_ds_comm as _counting_ds_comm

__all__ = ["BARS", "DS_STAGES", "LIMIT", "ZERO2_VARIANTS", "ZERO3_VARIANTS", "bench_worker",
           "bootstrap_ci", "chart", "configurations", "main", "make_batches", "make_model",
           "memory_worker", "paired_summary", "paired_table", "paired_worker", "peak_rss_mb",
           "precision_rows", "precision_table", "rss_mb", "sum_loss", "table", "verdict",
           "zero_study", "zero_study_worker", "zero_table"]

# -- the worker ------------------------------------------------------------------------------

def bench_worker(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    if not args.no_deepspeed:
        _setup_worker()
    torch.manual_seed(0)
    builders = configurations(args)
    steps, k = args.steps, args.k
    batches = make_batches(rank, steps * k, args.micro, args.dim)
    runs: dict[str, Run] = {}
    rss_delta: dict[str, float] = {}
    for name, build in builders.items():
        before = rss_mb()
        runs[name] = build()
        runs[name](batches[:k])  # warm-up step (allocates gradients, optimizer state, buckets)
        rss_delta[name] = rss_mb() - before
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]  # alternate the order: no position bias
        for name in order:
            times[name].append(_timed(runs[name], batches) / steps)
    return {"times": times, "rss_delta_mb": rss_delta, "peak_rss_mb": peak_rss_mb(),
            "params": sum(p.numel() for p in make_model(args.dim, args.hidden).parameters())}



def memory_worker(rank: int, world: int, args: argparse.Namespace, name: str) -> float:
    if not args.no_deepspeed:
        _setup_worker()
    run = configurations(args)[name]()
    run(make_batches(rank, args.k, args.micro, args.dim))
    return peak_rss_mb()



def chart(res: dict[str, Any], path: str) -> None:
    """PNG: × limit per configuration, RSS growth beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = {n: statistics.median(v) for n, v in res["times"].items()}
    limit = med["limit (compute + 1 all-reduce)"]
    names = list(med)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 0.4 * len(names) + 1.5), sharey=True)
    a.barh(names, [med[n] / limit for n in names])
    a.axvline(1.0, color="k", lw=0.8)
    a.set_xlabel("× limit (s / step, median)")
    a.invert_yaxis()
    b.barh(names, [res["rss_delta_mb"][n] for n in names], color="tab:orange")
    b.set_xlabel("RSS growth, rank 0 (MB)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# -- report --------------------------------------------------------------------------------------

def table(result: dict[str, Any], args: argparse.Namespace, mem: dict[str, list[float]] | None) -> str:
    times = result["times"]
    med = {n: statistics.median(v) for n, v in times.items()}
    limit = med["limit (compute + 1 all-reduce)"]
    head = ("| configuration | s / optimizer step (median) | min-max over rounds | × limit | "
            "RSS growth (MB, rank 0) |" + (" peak RSS (MB, rank 0/1) |" if mem else ""))
    lines = [head, "|" + "---|" * (5 + bool(mem))]
    for n, v in times.items():
        row = (f"| {n} | {med[n]:.3f} | {min(v):.3f}-{max(v):.3f} | {med[n] / limit:.2f} | "
               f"{result['rss_delta_mb'][n]:.0f} |")
        if mem:
            row += " " + "/".join(f"{x:.0f}" for x in mem[n]) + " |"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 rounds x 1 step (smoke check)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per measurement")
    p.add_argument("-k", "--k", type=int, default=8, help="micro-steps per optimizer step")
    p.add_argument("--micro", type=int, default=8, help="samples per micro-batch")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--no-deepspeed", action="store_true", help="skip the DeepSpeed rows")
    p.add_argument("--only", nargs="*", help="keep configurations whose name contains one of these")
    p.add_argument("--exact", action="store_true",
                   help="--only names whole configurations (e.g. the default row without the "
                        "variants whose names extend it)")
    p.add_argument("--isolated-memory", action="store_true",
                   help="also measure peak RSS of each configuration in its own spawn (slow)")
    p.add_argument("--json", help="write raw results to this file")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--png", help="write a bar chart (× limit, memory) to this PNG file")
    p.add_argument("--paired", action="store_true",
                   help="decide the bars: one step at a time, every configuration between two "
                        "limit steps, per-round ratios, median with a bootstrap 95%% interval "
                        "(use with --only and many --rounds, e.g. 30)")
    p.add_argument("--zero-study", type=int, choices=(2, 3),
                   help="DeepSpeed ZeRO-2 or -3 variants (sync mode and engine knobs), each in its "
                        "own spawn: collectives, seconds (paired with the limit), peak RSS")
    p.add_argument("--warm", type=int, default=2, help="untimed warm-up steps (--paired)")
    p.add_argument("--precision", action="store_true",
                   help="only the bf16 accumulation precision table (K = 4, 64, 512)")
    args = p.parse_args(argv)
    if args.precision:
        rows = precision_rows()
        print(precision_table(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    if args.quick:
        args.rounds, args.steps = 3, 1
    if not args.no_deepspeed:
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            print("deepspeed is not installed: DeepSpeed rows skipped", file=sys.stderr)
            args.no_deepspeed = True

    from accumguard import run_on_ranks

    env = {"DS_ACCELERATOR": "cpu"}
    t0 = time.perf_counter()
    if args.paired:
        return _main_paired(args, env, t0)
    if args.zero_study:
        load0 = os.getloadavg()
        print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  torch "
              f"{torch.__version__}  DeepSpeed ZeRO-{args.zero_study} variants, K={args.k}, "
              f"micro={args.micro}, {args.rounds} paired rounds each; load average before "
              f"{load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}", flush=True)
        rows = zero_study(args, args.zero_study, env)
        print(f"# wall {time.perf_counter() - t0:.0f} s; load average after "
              + "/".join(f"{x:.1f}" for x in os.getloadavg()))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "rows": rows}, f, indent=1)
        return 0
    results = run_on_ranks(bench_worker, 2, (args,), timeout=args.timeout, env=env)
    res = results[0]
    mem = None
    if args.isolated_memory:
        print(table(res, args, None), flush=True)  # the timings first: memory takes a while
        mem = {name: run_on_ranks(memory_worker, 2, (args, name), timeout=args.timeout, env=env)
               for name in res["times"]}
    print(f"# {datetime.date.today()}  torch {torch.__version__}  model {res['params'] / 1e6:.2f} M "
          f"params, K={args.k}, micro={args.micro}, 2 gloo ranks x 1 thread, {args.rounds} rounds "
          f"x {args.steps} steps; load average {os.getloadavg()[0]:.1f}; peak RSS over the whole run: rank 0 "
          f"{results[0]['peak_rss_mb']:.0f} MB, rank 1 {results[1]['peak_rss_mb']:.0f} MB; "
          f"wall {time.perf_counter() - t0:.0f} s")
    print(table(res, args, mem))
    if args.png:
        chart(res, args.png)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "isolated_memory": mem}, f, indent=1)
    return 0


def _main_paired(args: argparse.Namespace, env: dict[str, str], t0: float) -> int:
    from accumguard import run_on_ranks

    load0 = os.getloadavg()
    results = run_on_ranks(paired_worker, 2, (args,), timeout=args.timeout, env=env)
    rows = paired_summary(results[0]["samples"])
    load1 = os.getloadavg()
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  torch "
          f"{torch.__version__}  model {results[0]['params'] / 1e6:.2f} M params, K={args.k}, "
          f"micro={args.micro}, 2 gloo ranks x 1 thread; paired: {args.rounds} rounds, each "
          f"configuration's step between two limit steps; load average (1/5/15 min) before "
          f"{load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, after {load1[0]:.1f}/{load1[1]:.1f}/"
          f"{load1[2]:.1f}; wall {time.perf_counter() - t0:.0f} s")
    print(paired_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "samples": results[0]["samples"], "rows": rows,
                       "load_before": load0, "load_after": load1}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
