"""DeepSpeed ZeRO study of ``accumguard bench --zero-study``: what the engine's knobs do.

Each variant runs in its own spawn (peak memory is per process), timed paired with the
limit, with DeepSpeed's collectives counted at its comm backend.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from accumguard.demo._bench_paired import paired_summary
from accumguard.demo._bench_setup import (
    _build_local,
    _run_accumulator,
    _setup_worker,
    _timed_step,
    make_batches,
    make_model,
    rss_mb,
)
from accumguard.engines import _pair
from accumguard.engines.collectives import DS_REDUCE_OPS, OWN_OTHER_OPS, OWN_REDUCE_OPS

# -- DeepSpeed ZeRO: what the engine's knobs do to collectives, time and memory ---------------
# name -> (sync mode of the adapter, extra "zero_optimization" keys). ZeRO-3 knobs: parameter
# persistence (parameters at most this big are never partitioned: no all-gather, full memory),
# the live-parameter budget / reuse distance (how long gathered parameters may stay), prefetch.
ZERO3_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "native GA (config GA = K)": ("eager", {}),
    "coalesced (config GA = 1)": ("deferred", {}),
    "coalesced, no prefetch (stage3_prefetch_bucket_size 0)": (
        "deferred", {"stage3_prefetch_bucket_size": 0}),
    "coalesced, live/reuse 1e12 (stage3_max_live_parameters, stage3_max_reuse_distance)": (
        "deferred", {"stage3_max_live_parameters": 10**12, "stage3_max_reuse_distance": 10**12}),
    "coalesced, persistence 2e6 (2 of 3 weight matrices whole)": (
        "deferred", {"stage3_param_persistence_threshold": 2 * 10**6}),
    "coalesced, persistence 1e12 (every parameter whole)": (
        "deferred", {"stage3_param_persistence_threshold": 10**12}),
    "native GA, persistence 1e12": ("eager", {"stage3_param_persistence_threshold": 10**12}),
    # Not an engine knob: the adapter's DeepSpeedEngineAdapter(window_memory="unsharded").
    "coalesced, accumguard window_memory=unsharded": ("deferred", {"window_memory": "unsharded"}),
    "native GA, accumguard window_memory=unsharded": ("eager", {"window_memory": "unsharded"}),
}
ZERO2_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "native GA (config GA = K)": ("eager", {}),
    "coalesced (config GA = 1)": ("deferred", {}),
    "coalesced, overlap_comm": ("deferred", {"overlap_comm": True}),
    "coalesced, contiguous_gradients false": ("deferred", {"contiguous_gradients": False}),
    "coalesced, reduce_scatter false (all-reduce)": ("deferred", {"reduce_scatter": False}),
    "coalesced, buckets 5e8": ("deferred", {"reduce_bucket_size": 5 * 10**8,
                                            "allgather_bucket_size": 5 * 10**8}),
}
_GATHERS = ("all_gather_into_tensor", "all_gather", "all_gather_coalesced")
_REDUCES = DS_REDUCE_OPS


def _vm_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0), so that
    the peak of one phase can be read in a process that ran others before."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _counting_ds_comm(counts: dict[str, list[int]], min_bytes: int = 4096) -> Iterator[None]:
    """Count DeepSpeed's collectives at its backend (``deepspeed.comm.comm.cdb``, through which
    every deepspeed.comm call goes, once), and accumguard's 2-rank exchanges that stand for
    them (:mod:`accumguard.engines._pair`): op -> [calls, bytes]; only for tensors larger
    than ``min_bytes`` (default 4 KiB: the step's norm/overflow all-reduces are left out)."""
    from deepspeed.comm import comm as ds_comm

    cdb = ds_comm.cdb
    patched = []

    def counted(op: str, real: Callable[..., object]) -> Callable[..., object]:
        def call(*a: object, **kw: object) -> object:
            tensors = [x for x in (*a, *kw.values()) if isinstance(x, torch.Tensor)]
            nbytes = max((t.numel() * t.element_size() for t in tensors), default=0)
            if nbytes > min_bytes:
                c = counts.setdefault(op, [0, 0])
                c[0] += 1
                c[1] += nbytes
            return real(*a, **kw)

        return call

    for op in (*_GATHERS, *_REDUCES):
        real = getattr(cdb, op, None)
        if callable(real):
            patched.append(op)
            setattr(cdb, op, counted(op, real))
    # accumguard's 2-rank exchanges (gloo), which stand for a reduce-scatter or an all-gather
    own = [(op, getattr(_pair, op)) for op in (*OWN_REDUCE_OPS, *OWN_OTHER_OPS)]
    for op, real in own:
        setattr(_pair, op, counted(op, real))
    try:
        yield
    finally:
        for op in patched:
            delattr(cdb, op)  # the instance attribute shadowed the class's method
        for op, real in own:
            setattr(_pair, op, real)


def zero_study_worker(rank: int, world: int, args: argparse.Namespace, stage: int, sync: str,
                      extra: dict[str, Any]) -> dict[str, Any]:
    """One ZeRO variant in a fresh pair of processes (peak memory is per process): built
    next to the limit, timed in paired rounds (L V L ...), then 2 more steps alone with the
    collectives counted and the peak RSS mark reset before them."""
    _setup_worker()
    import deepspeed

    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter

    torch.manual_seed(0)
    k = args.k
    batches = make_batches(rank, k, args.micro, args.dim)
    limit = _build_local(args, with_allreduce=True)
    limit(batches)
    rss0 = rss_mb()
    model = make_model(args.dim, args.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    extra = dict(extra)
    memory = extra.pop("window_memory", "sharded")  # the adapter's option, not DeepSpeed's
    config = {"train_micro_batch_size_per_gpu": args.micro,
              "gradient_accumulation_steps": 1 if sync == "deferred" else k,
              "gradient_clipping": 0.0, "zero_optimization": {"stage": stage, **extra},
              "steps_per_print": 10**9}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    adapter = DeepSpeedEngineAdapter(engine, sync=sync, window_memory=memory)
    run = _run_accumulator(engine, None, adapter, k)
    for _ in range(args.warm):
        run(batches)
    built_mb = rss_mb() - rss0
    persistent = sum(int(p.ds_numel) for p in engine.module.parameters()
                     if getattr(p, "ds_persist", False))
    samples = []
    for _ in range(args.rounds):
        a = _timed_step(limit, batches)
        v = _timed_step(run, batches)
        b = _timed_step(limit, batches)
        samples.append([v[0], a[0], b[0], v[1], a[1], b[1]])
    counts: dict[str, list[int]] = {}
    before = rss_mb()
    reset = _reset_peak_rss()
    steps = 2
    with _counting_ds_comm(counts):
        for _ in range(steps):
            run(batches)
    peak_extra = _vm_kb("VmHWM") / 1024 - before if reset else float("nan")
    per_step = {op: [c[0] / steps, c[1] / steps / 2**20] for op, c in counts.items()}
    return {"samples": samples, "per_step": per_step, "built_mb": built_mb,
            "peak_extra_mb": peak_extra, "persistent_elements": persistent,
            "params": sum(p.numel() for p in make_model(args.dim, args.hidden).parameters())}


def zero_study(args: argparse.Namespace, stage: int, env: dict[str, str]) -> list[dict[str, Any]]:
    from accumguard import run_on_ranks

    variants = ZERO3_VARIANTS if stage == 3 else ZERO2_VARIANTS
    rows = []
    for name, (sync, extra) in variants.items():
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        res = run_on_ranks(zero_study_worker, 2, (args, stage, sync, extra),
                           timeout=args.timeout, env=env)
        summary = paired_summary({name: res[0]["samples"]}, {})[0]
        ops = res[0]["per_step"]
        gathers = [sum(ops.get(o, [0, 0])[i] for o in (*_GATHERS, *OWN_OTHER_OPS))
                   for i in (0, 1)]
        reduces = [sum(ops.get(o, [0, 0])[i] for o in (*_REDUCES, *OWN_REDUCE_OPS))
                   for i in (0, 1)]
        rows.append({**summary, "stage": stage, "sync": sync, "zero_optimization": extra,
                     "gathers_per_step": gathers[0], "gather_mb_per_step": gathers[1],
                     "reductions_per_step": reduces[0], "reduction_mb_per_step": reduces[1],
                     "ops": ops, "persistent_elements": res[0]["persistent_elements"],
                     "params": res[0]["params"],
                     "built_mb": [r["built_mb"] for r in res],
                     "peak_extra_mb": [r["peak_extra_mb"] for r in res],
                     "load": os.getloadavg()[0]})
        print(zero_table(rows[-1:], header=not rows[:-1]), flush=True)
    return rows


def zero_table(rows: list[dict[str, Any]], header: bool = True) -> str:
    lines = ["| ZeRO variant | s / step (median) | × limit (95 % CI) | CPU × limit | "
             "param all-gathers / step (MB) | gradient reductions / step (MB) | "
             "persistent elements | RSS after build (MB, rank 0/1) | "
             "peak RSS over a step (MB above its start, rank 0/1) | load |",
             "|---|---|---|---|---|---|---|---|---|---|"] if header else []
    for r in rows:
        lines.append(
            f"| ZeRO-{r['stage']} {r['configuration']} | {r['seconds']:.3f} | {r['ratio']:.2f} "
            f"({r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}) | {r['cpu_ratio']:.2f} | "
            f"{r['gathers_per_step']:g} ({r['gather_mb_per_step']:.0f}) | "
            f"{r['reductions_per_step']:g} ({r['reduction_mb_per_step']:.0f}) | "
            f"{r['persistent_elements'] / 1e6:.2f} M of {r['params'] / 1e6:.2f} M | "
            + "/".join(f"{x:.0f}" for x in r["built_mb"]) + " | "
            + "/".join(f"{x:.0f}" for x in r["peak_extra_mb"]) + f" | {r['load']:.1f} |")
    return "\n".join(lines)
