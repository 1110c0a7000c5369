"""The benchmark's model, data, memory readings, configurations and timing.

Shared by every mode of :mod:`accumguard.demo.bench` (table, paired, ZeRO study):
each configuration builder returns a function running optimizer steps on given batches,
and every timing is the slowest rank's (a step is as slow as the slowest rank).
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from accumguard.engines.base import Engine

DS_STAGES = (1, 2, 3)
_TORCH_LINEAR = torch.nn.functional.linear  # before any DeepSpeed ZeRO-3 engine replaces it

# One micro-batch (inputs, targets), and what every configuration builder returns: a function
# running optimizer steps on the given micro-batches.
Batch = tuple[torch.Tensor, torch.Tensor]
Run = Callable[[list[Batch]], None]


def make_model(dim: int, hidden: int, seed: int = 0) -> nn.Sequential:
    """An MLP of dim→hidden→hidden→dim (about 6.3 M parameters at 512/2048)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, dim))


def sum_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    loss: torch.Tensor = ((model(x) - y) ** 2).sum()
    return loss


def make_batches(rank: int, n: int, micro: int, dim: int) -> list[Batch]:
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

def _build_local(args: argparse.Namespace, with_allreduce: bool) -> Run:
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

    def run(batches: list[Batch]) -> None:
        for start in range(0, len(batches), k):
            window = batches[start:start + k]
            for b in window:
                sum_loss(model, b).backward()  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated
            if with_allreduce:
                dist.all_reduce(flat)  # the one gradient reduction a deferred step needs
                flat.div_(sum(len(b[0]) for b in window) * world)  # equal windows on all ranks
            opt.step()
            flat.zero_()  # keeps the views (zero_grad(set_to_none=True) would drop them)

    run.model = model  # type: ignore[attr-defined]  # for the tests
    return run


def _run_accumulator(model: torch.nn.Module, opt: torch.optim.Optimizer | None,
                     engine: Engine, k: int) -> Run:
    from accumguard import Accumulator

    acc = Accumulator(model, opt, accumulation_steps=k, engine=engine)
    # One windows() iterator for the whole benchmark, as a training loop has one per epoch:
    # a new iterator per call would add, per step, the end-of-data all-gather that a real
    # run pays once per epoch.
    pending: collections.deque[Batch] = collections.deque()

    def stream() -> Iterator[Batch]:
        while True:
            if not pending:
                raise RuntimeError("bench: the window iterator ran past the fed batches")
            yield pending.popleft()

    windows = acc.windows(stream())

    def run(batches: list[Batch]) -> None:
        if len(batches) % k:
            raise ValueError(f"bench: {len(batches)} micro-batches is not a multiple of K={k}")
        pending.extend(batches)
        for _ in range(len(batches) // k):
            next(windows).run(lambda b: sum_loss(model, b))

    run.model = model  # type: ignore[attr-defined]  # for the tests
    run.engine = engine  # type: ignore[attr-defined]  # for the tests and benchmarks/*_phases.py
    return run


def _build_ddp(args: argparse.Namespace, sync: str, count: bool = False, bucket_view: bool = False,
               ) -> Run:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumguard.engines.ddp import DDPEngine

    model = DDP(make_model(args.dim, args.hidden), gradient_as_bucket_view=bucket_view)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _run_accumulator(model, opt, DDPEngine(model, sync=sync, count_collectives=count),
                            args.k)


def _build_fsdp2(args: argparse.Namespace, sync: str, memory: str = "sharded",
                 skip_hooks: bool = True, pair: bool = True) -> Run:
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
    engine = FSDP2Engine(model, sync=sync, window_memory=memory,  # type: ignore[arg-type]
                         skip_idle_hooks=skip_hooks, pair_all_reduce=pair)
    return _run_accumulator(model, opt, engine, args.k)


def _build_deepspeed(args: argparse.Namespace, stage: int, sync: str, memory: str = "sharded",
                     zero_extra: dict[str, Any] | None = None, lean: bool = True,
                     skip_hooks: bool = True, keep_bucket: bool = True) -> Run:
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
    run = _run_accumulator(engine, None,
                           DeepSpeedEngineAdapter(engine, sync=sync, window_memory=memory,
                                                  lean_flush=lean, skip_idle_hooks=skip_hooks,
                                                  keep_reduce_bucket=keep_bucket),
                           args.k)
    # ZeRO-3 replaces torch.nn.functional.linear for the whole process ("memory efficient
    # linear", on by default): only this configuration's steps run with DeepSpeed's, so the
    # limit and the other rows run torch's own, as they would without DeepSpeed.
    installed = torch.nn.functional.linear
    torch.nn.functional.linear = _TORCH_LINEAR
    if installed is _TORCH_LINEAR:
        return run

    def run_with_its_linear(batches: list[Batch]) -> None:
        torch.nn.functional.linear = installed
        try:
            run(batches)
        finally:
            torch.nn.functional.linear = _TORCH_LINEAR

    run_with_its_linear.model = run.model  # type: ignore[attr-defined]  # for the tests
    run_with_its_linear.engine = run.engine  # type: ignore[attr-defined]  # benchmarks/*_phases.py
    return run_with_its_linear


def configurations(args: argparse.Namespace) -> dict[str, Callable[[], Run]]:
    """Name → builder, in table order."""
    cfgs: dict[str, Callable[[], Run]] = {
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
        # The adapter before 2026-12-02's fast path: FSDP2's forward hooks in every micro-step
        # (skip_idle_hooks=False) and gloo's own reduce-scatter (pair_all_reduce=False).
        cfgs["FSDP2 deferred, window_memory=unsharded, without the fast path"] = (
            lambda: _build_fsdp2(args, "deferred", "unsharded", skip_hooks=False, pair=False))
    if not args.no_deepspeed:
        for stage in DS_STAGES:
            for sync in ("eager", "deferred"):
                label = "native GA" if sync == "eager" else "coalesced"
                def build(s: int = stage, m: str = sync) -> Run:
                    return _build_deepspeed(args, s, m)

                cfgs[f"DeepSpeed ZeRO-{stage} {sync} ({label})"] = build
        # The ZeRO-2 recipe measured in docs/performance.md (no copy into a contiguous buffer).
        cfgs["DeepSpeed ZeRO-2 deferred (coalesced), contiguous_gradients false"] = (
            lambda: _build_deepspeed(args, 2, "deferred",
                                     zero_extra={"contiguous_gradients": False}))
        # DeepSpeed's own flush (the adapter before lean_flush), side by side.
        cfgs["DeepSpeed ZeRO-2 deferred (coalesced), lean_flush=False"] = (
            lambda: _build_deepspeed(args, 2, "deferred", lean=False))
        # The lean flush allocating a new reduce bucket every flush, as DeepSpeed does.
        cfgs["DeepSpeed ZeRO-2 deferred (coalesced), keep_reduce_bucket=False"] = (
            lambda: _build_deepspeed(args, 2, "deferred", keep_bucket=False))
        cfgs["DeepSpeed ZeRO-3 deferred (coalesced), window_memory=unsharded"] = (
            lambda: _build_deepspeed(args, 3, "deferred", "unsharded"))
        cfgs["DeepSpeed ZeRO-3 deferred (coalesced), window_memory=unsharded, lean_flush=False"] = (
            lambda: _build_deepspeed(args, 3, "deferred", "unsharded", lean=False))
        # DeepSpeed's module hooks in every micro-step of the held window (before
        # skip_idle_hooks), and ZeRO-3 with torch's own linear (a DeepSpeed config key).
        cfgs["DeepSpeed ZeRO-3 deferred (coalesced), window_memory=unsharded, hooks every "
             "micro-step"] = lambda: _build_deepspeed(args, 3, "deferred", "unsharded",
                                                      skip_hooks=False)
        cfgs["DeepSpeed ZeRO-3 deferred (coalesced), window_memory=unsharded, "
             "memory_efficient_linear false"] = (
            lambda: _build_deepspeed(args, 3, "deferred", "unsharded",
                                     zero_extra={"memory_efficient_linear": False}))
    if args.only:
        # The reference rows stay: every ratio is measured against them in the same run.
        exact = getattr(args, "exact", False)  # --exact: whole names, not parts of names
        cfgs = {k: v for k, v in cfgs.items()
                if k.startswith(("local (compute only)", "limit"))
                or any(o.lower() == k.lower() if exact else o.lower() in k.lower()
                       for o in args.only)}
    return cfgs



# -- worker set-up and timing ----------------------------------------------------------------

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


def _timed(run: Run, batches: list[Batch]) -> float:
    """Wall time of `run` on every rank, max over ranks (the step is as slow as the slowest)."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    run(batches)
    elapsed = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def _timed_step(run: Run, batches: list[Batch]) -> tuple[float, float]:
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
