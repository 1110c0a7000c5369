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

Size (~870 lines): the benchmark's modes (table, paired, ZeRO study, precision) share the
model, the configurations and the timing. Known debt: the paired statistics and the ZeRO
study should move to their own modules (demo/bench_stats.py, demo/bench_zero.py).

Usage::

    python benchmarks/bench_engines.py            # full: 7 rounds x 2 steps
    python benchmarks/bench_engines.py --quick    # 3 rounds x 1 step, for a smoke check
    accumguard bench --paired --rounds 30 --only "DDP deferred" "ZeRO-2 deferred"
    accumguard bench --zero-study 3 --rounds 8
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

DS_STAGES = (1, 2, 3)


def make_model(dim: int, hidden: int, seed: int = 0) -> nn.Module:
    """An MLP of dim→hidden→hidden→dim (about 6.3 M parameters at 512/2048)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, dim))


def sum_loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).sum()


def make_batches(rank: int, n: int, micro: int, dim: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(micro, dim, generator=g), torch.randn(micro, dim, generator=g))
            for _ in range(n)]


def rss_mb() -> float:
    """Current resident set size (MB), from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


# -- configurations ------------------------------------------------------------------------
# Each builder returns a function running `steps` optimizer steps on the given batches.

def _build_local(args: Any, with_allreduce: bool) -> Callable[[list], None]:
    """The reference rows, built like the best deferred data-parallel step can be: the same
    model, data and optimizer as the Accumulator rows, K forward+backward passes with no
    communication, then (``with_allreduce``) exactly ONE all-reduce of the real gradients
    and one division by the window's sample count over all ranks: the large-batch gradient
    the Accumulator computes (tests/demo/test_bench.py checks the updates are equal). The gradients live in one flat buffer (each
    ``p.grad`` a view of it), so the all-reduce needs no copy in or out: a strict limit,
    which DDP reaches only with ``gradient_as_bucket_view=True``."""
    import torch.distributed as dist

    model = make_model(args.dim, args.hidden)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    flat = torch.zeros(sum(p.numel() for p in params))
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    world = dist.get_world_size()
    k = args.k

    def run(batches: list) -> None:
        for start in range(0, len(batches), k):
            window = batches[start:start + k]
            for b in window:
                sum_loss(model, b).backward()
            if with_allreduce:
                dist.all_reduce(flat)  # the one gradient reduction a deferred step needs
                flat.div_(sum(len(b[0]) for b in window) * world)  # equal windows on all ranks
            opt.step()
            flat.zero_()  # keeps the views (zero_grad(set_to_none=True) would drop them)

    run.model = model  # type: ignore[attr-defined]  # for the tests
    return run


def _run_accumulator(model: Any, opt: Any, engine: Any, k: int) -> Callable[[list], None]:
    from accumguard import Accumulator

    acc = Accumulator(model, opt, accumulation_steps=k, engine=engine)
    # One windows() iterator for the whole benchmark, as a training loop has one per epoch:
    # a new iterator per call would add, per step, the end-of-data all-gather that a real
    # run pays once per epoch.
    pending: collections.deque = collections.deque()

    def stream() -> Iterator[Any]:
        while True:
            if not pending:
                raise RuntimeError("bench: the window iterator ran past the fed batches")
            yield pending.popleft()

    windows = acc.windows(stream())

    def run(batches: list) -> None:
        if len(batches) % k:
            raise ValueError(f"bench: {len(batches)} micro-batches is not a multiple of K={k}")
        pending.extend(batches)
        for _ in range(len(batches) // k):
            next(windows).run(lambda b: sum_loss(model, b))

    run.model = model  # type: ignore[attr-defined]  # for the tests
    return run


def _build_ddp(args: Any, sync: str, count: bool = False, bucket_view: bool = False,
               ) -> Callable[[list], None]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumguard.engines.ddp import DDPEngine

    model = DDP(make_model(args.dim, args.hidden), gradient_as_bucket_view=bucket_view)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _run_accumulator(model, opt, DDPEngine(model, sync=sync, count_collectives=count),
                            args.k)


def _build_fsdp2(args: Any, sync: str, memory: str = "sharded") -> Callable[[list], None]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from accumguard.engines.fsdp2 import FSDP2Engine

    model = make_model(args.dim, args.hidden)
    # The benchmark runs on CPU ranks (gloo): say so, or FSDP2 picks a CUDA mesh on GPU hosts.
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=False, mesh=mesh)
    fully_shard(model, reshard_after_forward=False, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine = FSDP2Engine(model, sync=sync, window_memory=memory)  # type: ignore[arg-type]
    return _run_accumulator(model, opt, engine, args.k)


def _build_deepspeed(args: Any, stage: int, sync: str, memory: str = "sharded",
                     zero_extra: dict[str, Any] | None = None) -> Callable[[list], None]:
    import deepspeed

    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter

    model = make_model(args.dim, args.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = {
        "train_micro_batch_size_per_gpu": args.micro,
        "gradient_accumulation_steps": 1 if sync == "deferred" else args.k,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, **(zero_extra or {})},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return _run_accumulator(engine, None,
                            DeepSpeedEngineAdapter(engine, sync=sync, window_memory=memory),
                            args.k)


def configurations(args: Any) -> dict[str, Callable[[], Callable[[list], None]]]:
    """Name → builder, in table order."""
    cfgs: dict[str, Callable[[], Callable[[list], None]]] = {
        "local (compute only)": lambda: _build_local(args, with_allreduce=False),
        "limit (compute + 1 all-reduce)": lambda: _build_local(args, with_allreduce=True),
        "DDP deferred": lambda: _build_ddp(args, "deferred"),
        "DDP eager": lambda: _build_ddp(args, "eager"),
        "DDP deferred, counting comm hook": lambda: _build_ddp(args, "deferred", count=True),
        "DDP deferred, gradient_as_bucket_view": lambda: _build_ddp(args, "deferred",
                                                                    bucket_view=True),
    }
    try:
        import accumguard.engines.fsdp2  # noqa: F401
    except ImportError:
        pass
    else:
        cfgs["FSDP2 deferred"] = lambda: _build_fsdp2(args, "deferred")
        cfgs["FSDP2 eager"] = lambda: _build_fsdp2(args, "eager")
        cfgs["FSDP2 deferred, window_memory=unsharded"] = (
            lambda: _build_fsdp2(args, "deferred", "unsharded"))
    if not args.no_deepspeed:
        for stage in DS_STAGES:
            for sync in ("eager", "deferred"):
                label = "native GA" if sync == "eager" else "coalesced"
                cfgs[f"DeepSpeed ZeRO-{stage} {sync} ({label})"] = (
                    lambda s=stage, m=sync: _build_deepspeed(args, s, m))
        # The ZeRO-2 recipe measured in docs/performance.md (no copy into a contiguous buffer).
        cfgs["DeepSpeed ZeRO-2 deferred (coalesced), contiguous_gradients false"] = (
            lambda: _build_deepspeed(args, 2, "deferred",
                                     zero_extra={"contiguous_gradients": False}))
        cfgs["DeepSpeed ZeRO-3 deferred (coalesced), window_memory=unsharded"] = (
            lambda: _build_deepspeed(args, 3, "deferred", "unsharded"))
    if args.only:
        # The reference rows stay: every ratio is measured against them in the same run.
        cfgs = {k: v for k, v in cfgs.items()
                if k.startswith(("local (compute only)", "limit"))
                or any(o.lower() in k.lower() for o in args.only)}
    return cfgs


# -- the worker ------------------------------------------------------------------------------

def _setup_worker() -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    warnings.filterwarnings("ignore")
    try:
        import logging

        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")  # reuses the existing process group
        deepspeed.utils.logger.setLevel(logging.WARNING)
    except ImportError:
        pass


def _timed(run: Callable[[list], None], batches: list) -> float:
    """Wall time of `run` on every rank, max over ranks (the step is as slow as the slowest)."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    run(batches)
    elapsed = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def bench_worker(rank: int, world: int, args: Any) -> dict[str, Any]:
    if not args.no_deepspeed:
        _setup_worker()
    torch.manual_seed(0)
    builders = configurations(args)
    steps, k = args.steps, args.k
    batches = make_batches(rank, steps * k, args.micro, args.dim)
    runs: dict[str, Callable[[list], None]] = {}
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


# -- paired measurement: deciding a bar on a noisy machine ------------------------------------
# The bars of issue 13 (× the limit), by configuration name.
BARS: dict[str, float] = {
    "DDP deferred": 1.05,
    "DeepSpeed ZeRO-2 deferred (coalesced)": 1.2,
    "DeepSpeed ZeRO-2 deferred (coalesced), contiguous_gradients false": 1.2,
    "FSDP2 deferred, window_memory=unsharded": 1.5,
}
LIMIT = "limit (compute + 1 all-reduce)"


def _timed_step(run: Callable[[list], None], batches: list) -> tuple[float, float]:
    """One measurement: (wall seconds, max over ranks; CPU seconds of the process, summed
    over ranks). CPU time counts every thread (gloo's too) but not time spent waiting, so it
    measures the work done, which neighbours on a shared machine disturb much less."""
    import torch.distributed as dist

    dist.barrier()
    c0, t0 = time.process_time(), time.perf_counter()
    run(batches)
    mine = torch.tensor([time.perf_counter() - t0, time.process_time() - c0],
                        dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    both = torch.stack(gathered)
    return float(both[:, 0].max()), float(both[:, 1].sum())


def paired_worker(rank: int, world: int, args: Any) -> dict[str, Any]:
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
_REDUCES = ("reduce_scatter_tensor", "reduce_scatter", "all_reduce", "all_reduce_coalesced",
            "inference_all_reduce", "reduce", "all_to_all_single")


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
    every deepspeed.comm call goes, once): op -> [calls, bytes]; only for tensors larger
    than ``min_bytes`` (default 4 KiB: the step's norm/overflow all-reduces are left out)."""
    from deepspeed.comm import comm as ds_comm

    cdb = ds_comm.cdb
    patched = []

    def counted(op: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
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
    try:
        yield
    finally:
        for op in patched:
            delattr(cdb, op)  # the instance attribute shadowed the class's method


def zero_study_worker(rank: int, world: int, args: Any, stage: int, sync: str,
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


def zero_study(args: Any, stage: int, env: dict[str, str]) -> list[dict[str, Any]]:
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
        gathers = [sum(ops.get(o, [0, 0])[i] for o in _GATHERS) for i in (0, 1)]
        reduces = [sum(ops.get(o, [0, 0])[i] for o in _REDUCES) for i in (0, 1)]
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


def memory_worker(rank: int, world: int, args: Any, name: str) -> float:
    if not args.no_deepspeed:
        _setup_worker()
    run = configurations(args)[name]()
    run(make_batches(rank, args.k, args.micro, args.dim))
    return peak_rss_mb()


# -- precision: bf16 parameters, fp32 vs bf16 accumulation, fp32 master weights -------------

def precision_rows(ks: tuple[int, ...] = (4, 64, 512), dim: int = 64, micro: int = 4,
                   lr: float = 1e-2) -> list[dict[str, Any]]:
    """bf16 parameters, single process, per K: bf16 accumulation (``accumulation_dtype=
    "native"``), fp32 accumulation (``"auto"``) and fp32 accumulation with fp32 master
    weights (``master_weights=True``). Relative errors of the gradient one SGD step (``lr``)
    receives, against (a) the fp64 reference of the whole batch (includes the bf16
    forward/backward of each micro-step, which no accumulation can fix) and (b) the exact
    (fp64) sum of the very bf16 micro-gradients the run computed: the accumulation error
    alone; (b) for the fp32 window sum before any cast; the relative error of the *update*
    of the weights the optimizer steps (the bf16 parameters, or the fp32 masters: the run's
    real weights) against the fp64 reference's update; seconds per optimizer step and the
    bytes of the fp32 buffers (main gradients, masters)."""
    from accumguard import Accumulator

    def loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return ((m(b[0].to(torch.bfloat16)).float() - b[1]) ** 2).sum()

    def bf16_copy(base: nn.Module) -> nn.Module:
        m = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        m.load_state_dict(base.state_dict())
        return m.to(torch.bfloat16)

    def flat_grad(m: nn.Module) -> torch.Tensor:
        return torch.cat([p.grad.double().flatten() for p in m.parameters()
                          if p.grad is not None])

    def stepped(o: torch.optim.Optimizer) -> list[torch.Tensor]:  # masters, if swapped in
        return [p for group in o.param_groups for p in group["params"]]

    def flat(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.detach().double().flatten() for t in ts])

    def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
        return float((x - ref).norm() / ref.norm())

    rows = []
    for k in ks:
        g = torch.Generator().manual_seed(k)
        data = [(torch.randn(micro, dim, generator=g) + 1.0, torch.randn(micro, dim, generator=g))
                for _ in range(k)]
        torch.manual_seed(0)
        base = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        base.load_state_dict(bf16_copy(base).state_dict())  # same (bf16-rounded) start
        ref = bf16_copy(base).double()
        total = sum(((ref(x.double()) - y.double()) ** 2).sum() for x, y in data)
        (total / (k * micro)).backward()
        ref_g = flat_grad(ref)
        exact = torch.zeros_like(ref_g)  # exact sum of the bf16 micro-gradients
        one = bf16_copy(base)
        for b in data:
            one.zero_grad(set_to_none=True)
            loss(one, b).backward()
            exact += flat_grad(one)
        exact /= k * micro
        for mode in ("native", "auto", "master"):
            model = bf16_copy(base)
            seen: list[torch.Tensor] = []
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            opt.register_step_pre_hook(lambda o, a, kw, s=seen: s.append(
                flat([p.grad for p in stepped(o) if p.grad is not None])))
            acc = Accumulator(model, opt, accumulation_steps=k, master_weights=mode == "master",
                              accumulation_dtype="native" if mode == "native" else "auto")
            before = flat(stepped(opt))
            main = acc.engine.main_grads
            if main is not None:
                main.keep_last = True
            t0 = time.perf_counter()
            for w in acc.windows(data):
                w.run(lambda b, m=model: loss(m, b))
            secs = time.perf_counter() - t0
            last = main.last_sum if main is not None else None
            masters = acc.masters
            rows.append({"K": k, "accumulation": acc.accumulation_dtype
                         + (" + master weights" if masters is not None else ""),
                         "error_vs_fp64": rel(seen[0], ref_g),
                         "accumulation_error": rel(seen[0], exact),
                         "fp32_sum_accumulation_error": (None if last is None else
                                                         rel(last.double(), exact)),
                         "update_error_vs_fp64": rel(flat(stepped(opt)) - before, -lr * ref_g),
                         "lr": lr, "seconds": secs,
                         "extra_bytes": (0 if main is None else main.nbytes)
                         + (0 if masters is None else masters.nbytes)})
            acc.close()
    return rows


def precision_table(rows: list[dict[str, Any]]) -> str:
    lr = rows[0]["lr"] if rows else 0.0
    lines = ["| K | accumulation | step gradient vs fp64 reference | step gradient vs exact sum "
             "of the bf16 micro-gradients | fp32 window sum vs that exact sum | update of the "
             f"stepped weights vs fp64 (SGD lr={lr:g}) | s / step | extra memory (bytes) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        se = r["fp32_sum_accumulation_error"]
        lines.append(f"| {r['K']} | {r['accumulation']} | {r['error_vs_fp64']:.2e} | "
                     f"{r['accumulation_error']:.2e} | {'-' if se is None else f'{se:.2e}'} | "
                     f"{r['update_error_vs_fp64']:.2e} | {r['seconds']:.3f} | "
                     f"{r['extra_bytes']} |")
    return "\n".join(lines)


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

def table(result: dict[str, Any], args: Any, mem: dict[str, list[float]] | None) -> str:
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


def _main_paired(args: Any, env: dict[str, str], t0: float) -> int:
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
