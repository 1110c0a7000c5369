"""Audit a real training loop against the single-process large-batch reference.

Public API (stable; the demo and the CLI are built on it)::

    report = audit(setup, my_loop, world_size=2)            # one loop
    reports = audit_many(setup, {"ok": loop_a, "bug": loop_b})  # several, one spawn
    report.passed, report.first_divergence, report.diagnosis, report.to_dict()

``setup`` is an :class:`~accumguard.verify.contract.AuditSetup`, a loop is
``loop(ctx: LoopContext) -> None`` (any picklable callable: a module-level
function or a ``functools.partial`` of one). See ``docs/audit.md``.

How it works. :func:`audit` starts W ranks with :func:`accumguard.runtime.launch.run_on_ranks`
(or runs in place when a process group is already initialised, e.g. under
``torchrun``). On every rank the loop runs on a fresh ``setup.build_model()``
under an observer that needs no cooperation from the loop:

* global optimizer-step pre/post hooks (every ``torch.optim.Optimizer``,
  including the one inside DeepSpeed) give the gradient the optimizer receives
  and the LR it uses; nested optimizers (ZeroRedundancyOptimizer) count once,
  DeepSpeed's per-parameter-group inner steps are merged into one; DeepSpeed
  ZeRO-1/2 flat fp32 gradient partitions are all-gathered and cut back into
  parameters (ZeRO-3: not observable, updates only);
* parameters are snapshotted after each step, lazily, at the next forward or
  optimizer step or at the end of the loop, so that engines that copy updated
  weights back after the inner step (DeepSpeed ZeRO-1/2) are seen right;
  FSDP2 DTensors are gathered with ``full_tensor()``, DeepSpeed ZeRO-3 with
  ``GatheredParameters``;
* a hook on the model output counts backward passes; wrappers around the
  ``torch.distributed`` reduce collectives count gradient collectives (calls
  and *rounds*); DDP's C++ reducer bypasses Python, so a DDP sync round is
  inferred from ``require_backward_grad_sync`` at forward time (DDP decides
  there) and counted when that output's backward runs;
* ``LRScheduler.step``, ``Optimizer.zero_grad`` and ``Module.zero_grad`` are
  wrapped for the duration of the loop and restored afterwards.

The parent process computes the fp64 reference (:func:`accumguard.verify.reference.reference_run`
on the canonical K-windows), compares step by step, and on failure runs the
diagnosis (:mod:`accumguard.verify.diagnosis`).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from accumguard.core.errors import ConfigError
from accumguard.engines.registry import is_deepspeed_engine
from accumguard.verify.contract import AuditSetup, Loop, LoopContext
from accumguard.verify.reference import (
    _single_thread,
    canonical_name,
    flat_params,
    relative_update_error,
    windows_for_reference,
)

__all__ = [
    "AuditReport",
    "StepCounts",
    "StepRecord",
    "Divergence",
    "audit",
    "audit_many",
    "assert_passed",
    "default_tolerance",
    "FP32_TOLERANCE",
]

# fp32 target vs fp64 reference, relative to the update (mission.md).
FP32_TOLERANCE = 1e-5
# torch.distributed functions that reduce (gradient collectives); others are counted apart.
_REDUCE_OPS = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "_reduce_scatter_base", "reduce_scatter_single", "all_reduce_coalesced")
_OTHER_OPS = ("all_gather", "all_gather_into_tensor", "_all_gather_base", "broadcast",
              "all_gather_single", "all_to_all_single")
# The same at the deepspeed.comm level, patched once deepspeed is imported: its torch backend
# keeps its own reference to torch.distributed.reduce_scatter_tensor (ZeRO-2/3 reduce-scatters
# never reach the torch.distributed attribute), and DeepSpeed code calls these by module
# attribute on deepspeed.comm (the package) while reduce_scatter_fn calls the comm module's
# reduce_scatter_tensor: both namespaces are wrapped, a call is counted at its outermost level.
_DS_REDUCE_OPS = ("all_reduce", "inference_all_reduce", "all_reduce_coalesced", "reduce",
                  "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_fn")
_DS_OTHER_OPS = ("all_gather", "all_gather_into_tensor", "allgather_fn", "all_gather_coalesced",
                 "broadcast", "all_to_all_single")

ProgressFn = Callable[[str, int, int], None]


def default_tolerance(dtype: torch.dtype, accumulation_steps: int) -> tuple[float, str]:
    """Tolerance on the relative update error for a target whose parameters are ``dtype``.

    fp32/fp64: 1e-5 (mission.md; fp32 rounding over a few steps stays near 1e-6).
    bf16/fp16: each of the K accumulations, the sync and the optimizer round to
    the unit roundoff u (2^-8 for bf16, 2^-11 for fp16), so the *gradient* can be
    off by about (K + 2)·u; a factor 2 covers the optimizer's arithmetic. This is
    the returned tolerance. The *update* of low-precision weights additionally
    carries the rounding of the stored weights, u·‖θ‖ per step, which is large
    relative to a small update: step s's update is held to
    ``tol + (s+1)·u·‖θ_s‖/‖Δθ_s‖`` (see :func:`_update_tolerance`).
    """
    k = accumulation_steps
    if dtype == torch.bfloat16:
        u = 2.0 ** -8
        return 2 * (k + 2) * u, f"bf16: 2·(K+2)·u with u=2^-8, K={k}"
    if dtype == torch.float16:
        u = 2.0 ** -11
        return 2 * (k + 2) * u, f"fp16: 2·(K+2)·u with u=2^-11, K={k}"
    return FP32_TOLERANCE, f"{str(dtype).replace('torch.', '')}: 1e-5 relative to the update"


# ----------------------------------------------------------------------------- report types
@dataclass
class StepCounts:
    """Events seen during one optimizer step's window (or in total).

    Boundary work done right after a step (scheduler step, zero_grad) belongs to
    that step; the same calls made between backwards belong to the next one, and
    ``zero_grad_in_window`` counts zero_grad calls made while gradients of the
    window were already accumulated (failure class F3).
    """

    forward: int = 0
    backward: int = 0
    grad_collective_rounds: int = 0
    grad_collective_calls: int = 0
    ddp_sync_rounds: int = 0
    other_collective_calls: int = 0
    optimizer_steps: int = 0
    scheduler_steps: int = 0
    zero_grad: int = 0
    zero_grad_in_window: int = 0
    loss_calls: int = 0
    # Reduce collectives issued inside DeepSpeed's engine.step() (its gradient-norm and
    # overflow all-reduces): not gradient reductions, so counted apart.
    step_reduce_calls: int = 0

    def add(self, other: StepCounts) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass
class StepRecord:
    """One optimizer step of the loop under audit, compared with the reference step."""

    step: int
    update_error: float | None
    grad_error: float | None
    lr: list[float] | None
    ref_lr: list[float] | None
    loss: float | None
    ref_loss: float | None
    counts: StepCounts
    worst_parameter: str | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    # The bound the update error is held to at this step (see default_tolerance).
    update_tolerance: float | None = None


@dataclass
class Divergence:
    """The first step whose update (or gradient) error exceeds the tolerance."""

    step: int
    parameter: str
    max_abs_diff: float
    max_rel_diff: float
    update_error: float
    grad_error: float | None


@dataclass
class AuditReport:
    """Verdict of one audit. ``to_dict()`` is JSON-safe.

    ``passed`` means: same number of optimizer steps as the reference, every
    step's relative update error (and gradient error, where the gradient is
    observable) ≤ ``tolerance``, and all ranks hold the same parameters.
    ``losses`` is the per-step loss of the full effective batch as the loop saw
    it (all ranks' summed losses / their count, if the loop used
    ``ctx.loss_fn``), else the reference loss; ``loss_source`` says which.
    """

    name: str
    passed: bool
    tolerance: float
    tolerance_reason: str
    world_size: int
    accumulation_steps: int
    engine: str
    param_dtype: str
    reference_dtype: str
    optimizer_steps: int
    reference_steps: int
    steps: list[StepRecord]
    totals: StepCounts
    first_divergence: Divergence | None
    failures: list[str]
    notes: list[str]
    losses: list[float]
    loss_source: str
    gradients_observed: bool
    ranks_max_param_diff: float
    trailing_backward: int
    duration_s: float
    diagnosis: Any = None  # accumguard.verify.diagnosis.Diagnosis | None
    engine_info: dict[str, Any] = field(default_factory=dict)

    @property
    def max_update_error(self) -> float:
        errs = [s.update_error for s in self.steps if s.update_error is not None]
        return max(errs) if errs else float("nan")

    @property
    def max_grad_error(self) -> float | None:
        errs = [s.grad_error for s in self.steps if s.grad_error is not None]
        return max(errs) if errs else None

    def counts_per_step(self) -> dict[str, float]:
        """Mean of each count over the optimizer steps (what a healthy loop shows: 1 step,
        1 scheduler step, ≤1 gradient collective round, K backwards)."""
        n = max(1, len(self.steps))
        return {k: v / n for k, v in asdict(self.totals).items()}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["diagnosis"] = None if self.diagnosis is None else self.diagnosis.to_dict()
        out["max_update_error"] = _finite(self.max_update_error)
        out["max_grad_error"] = _finite(self.max_grad_error)
        return _json_safe(out)


def _finite(x: float | None) -> float | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return x


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, torch.Tensor):
        return _json_safe(obj.tolist())
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


# ----------------------------------------------------------------------------- public entry points
def audit(
    setup: AuditSetup,
    loop: Loop,
    *,
    world_size: int = 2,
    backend: str = "gloo",
    reference_dtype: torch.dtype = torch.float64,
    tolerance: float | None = None,
    timeout: float = 300,
    diagnose: bool = True,
    steps: int | None = None,
    name: str | None = None,
    progress: ProgressFn | None = None,
) -> AuditReport:
    """Run ``loop`` on ``world_size`` ranks, observe it, and compare it with the reference.

    Args:
        setup: how to build model, optimizer, scheduler, data and loss.
        loop: ``loop(ctx)``, your training loop (picklable: module-level function).
        world_size: ranks to spawn (ignored when already inside a process group:
            then the current group's size is used).
        backend: ``"gloo"`` (CPU) or ``"nccl"``.
        reference_dtype: dtype of the single-process reference (fp64 default; fp32
            is faster and looser).
        tolerance: bound on the relative update/gradient error; default from
            :func:`default_tolerance` for the model's parameter dtype.
        timeout: hard wall-clock limit in seconds for the whole run; hung ranks are
            killed and reported as :class:`~accumguard.core.errors.RankTimeoutError`.
        diagnose: on failure, name the bug class (:mod:`accumguard.verify.diagnosis`).
        steps: audit only the first ``steps`` optimizer steps' worth of data (K·steps
            micro-batches per rank).
        name: label in the report (default: the loop's ``__name__``).
        progress: ``progress(name, steps_done, steps_total)``, called in this process.

    Raises:
        RankFailedError: a rank raised (message names the rank and the traceback).
        RankTimeoutError: the run did not finish within ``timeout``.
    """
    label = name or _loop_name(loop)
    return audit_many(setup, {label: loop}, world_size=world_size, backend=backend,
                      reference_dtype=reference_dtype, tolerance=tolerance, timeout=timeout,
                      diagnose=diagnose, steps=steps, progress=progress)[label]


def audit_many(
    setup: AuditSetup,
    loops: dict[str, Loop],
    *,
    world_size: int = 2,
    backend: str = "gloo",
    reference_dtype: torch.dtype = torch.float64,
    tolerance: float | None = None,
    timeout: float = 300,
    diagnose: bool = True,
    steps: int | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, AuditReport]:
    """Audit several loops in ONE spawn: they run one after another in the same ranks,
    each on a fresh ``setup.build_model()``. Same arguments as :func:`audit`;
    ``timeout`` covers all loops together. A loop that raises aborts the whole call
    with :class:`~accumguard.core.errors.RankFailedError` naming the loop and the rank
    (the other ranks may be stuck in a collective, so continuing is not safe).
    """
    if not isinstance(setup, AuditSetup):
        raise ConfigError(f"setup must be an AuditSetup, got {type(setup).__name__}; build one "
                          "with AuditSetup(build_model=..., make_optimizer=..., ...)")
    if not loops:
        raise ConfigError("loops is empty; pass {'name': loop_function, ...}")
    for key, fn in loops.items():
        if not callable(fn):
            raise ConfigError(f"loop {key!r} is a {type(fn).__name__}, not a callable; pass a "
                              "function loop(ctx) -> None")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"steps ({steps!r}) must be a positive int or None (all data)")
    names = list(loops)
    fns = [loops[k] for k in names]
    t0 = time.monotonic()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = _observe_loops(rank, world, setup, names, fns, steps, None)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        per_rank = gathered
    else:
        per_rank = _spawn(setup, names, fns, world_size, backend, timeout, steps, progress)
        world = world_size
    elapsed = time.monotonic() - t0
    all_batches = _all_rank_batches(setup, world, steps)
    reports = {}
    with _single_thread():
        # Every loop of this call shares the setup, the world size and the batches, so the
        # reference (the parent's most expensive step for a passing loop) is computed once.
        ref = _reference(setup, all_batches, reference_dtype)
        # Likewise the diagnosis's simulations, shared by the broken loops of this call.
        from accumguard.verify.diagnosis import DiagnosisCache

        cache = DiagnosisCache()
        for i, key in enumerate(names):
            obs = [per_rank[r][i] for r in range(world)]
            reports[key] = _build_report(key, setup, obs, all_batches, world, reference_dtype,
                                         tolerance, diagnose, elapsed / len(names), ref, cache)
    return reports


def _reference(setup: AuditSetup, all_batches: list[list[Any]],
               reference_dtype: torch.dtype) -> Any:
    """The single-process large-batch reference on the canonical K-windows."""
    from accumguard.verify.reference import reference_run

    windows = windows_for_reference(all_batches, setup.accumulation_steps)
    return reference_run(setup.build_model(), setup.make_optimizer, windows, setup.loss_fn,
                         make_scheduler=setup.make_scheduler, max_grad_norm=setup.max_grad_norm,
                         dtype=reference_dtype)


# ----------------------------------------------------------------------------- spawning
def _loop_name(loop: Any) -> str:
    inner = getattr(loop, "func", loop)
    return getattr(inner, "__name__", type(inner).__name__)


def _spawn(setup: AuditSetup, names: list[str], fns: list[Loop], world_size: int, backend: str,
           timeout: float, steps: int | None, progress: ProgressFn | None) -> list[Any]:
    from accumguard.runtime.launch import run_on_ranks

    if progress is None:
        return run_on_ranks(_rank_main, world_size, (setup, names, fns, steps, None),
                            timeout=timeout, backend=backend)
    import multiprocessing as mp
    import queue
    import threading

    q = mp.get_context("spawn").Queue()
    stop = threading.Event()
    total = _expected_steps(setup, world_size, steps)

    def pump() -> None:
        while not stop.is_set():
            try:
                loop_name, done = q.get(timeout=0.2)
            except (queue.Empty, OSError, EOFError, ValueError):
                continue
            with contextlib.suppress(Exception):
                progress(loop_name, done, total)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    try:
        return run_on_ranks(_rank_main, world_size, (setup, names, fns, steps, q),
                            timeout=timeout, backend=backend)
    finally:
        stop.set()
        th.join(timeout=2)
        q.close()


def _expected_steps(setup: AuditSetup, world_size: int, steps: int | None) -> int:
    n = len(setup.rank_batches(0, world_size))
    k = setup.accumulation_steps
    total = -(-n // k)
    return total if steps is None else min(total, steps)


def _rank_batches(setup: AuditSetup, rank: int, world: int, steps: int | None) -> list[Any]:
    batches = list(setup.rank_batches(rank, world))
    if steps is not None:
        batches = batches[: steps * setup.accumulation_steps]
    return batches


def _all_rank_batches(setup: AuditSetup, world: int, steps: int | None) -> list[list[Any]]:
    return [_rank_batches(setup, r, world, steps) for r in range(world)]


def _rank_main(rank: int, world: int, setup: AuditSetup, names: list[str], fns: list[Loop],
               steps: int | None, q: Any) -> list[dict[str, Any]]:
    return _observe_loops(rank, world, setup, names, fns, steps, q)


def _observe_loops(rank: int, world: int, setup: AuditSetup, names: list[str],
                   fns: list[Loop], steps: int | None, q: Any) -> list[dict[str, Any]]:
    out = []
    for key, fn in zip(names, fns, strict=True):
        model = setup.build_model()
        ctx = LoopContext(rank=rank, world_size=world, setup=setup, model=model,
                          batches=_rank_batches(setup, rank, world, steps))
        obs = _Observer(ctx, key, q if rank == 0 else None)
        try:
            with obs.installed():
                fn(ctx)
                obs.finish()
        except BaseException as exc:  # noqa: BLE001 - re-raised with the loop's name
            raise RuntimeError(f"loop {key!r} raised on rank {rank}:\n"
                               f"{traceback.format_exc()}") from exc
        out.append(obs.result())
    return out


# ----------------------------------------------------------------------------- the observer
def _gather_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full parameters by name: DTensor → ``full_tensor()``; DeepSpeed ZeRO-3 gathered."""
    params = [p for p in model.parameters()]
    if any(hasattr(p, "ds_id") and hasattr(p, "ds_tensor") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return flat_params(model)
    return flat_params(model)


def _find_wrapper(max_depth: int = 12) -> tuple[str, Any]:
    """Which engine called the model's forward: walk the caller frames for a ``self``
    that is a DDP module or a DeepSpeed engine."""
    from torch.nn.parallel import DistributedDataParallel

    f = sys._getframe(2)
    for _ in range(max_depth):
        if f is None:
            break
        obj = f.f_locals.get("self")
        if obj is not None:
            if isinstance(obj, DistributedDataParallel):
                return "ddp", obj
            if is_deepspeed_engine(obj):
                return "deepspeed", obj
        f = f.f_back
    return "", None


class _Observer:
    """Everything the audit sees of one loop on one rank. Installs and removes its hooks."""

    def __init__(self, ctx: LoopContext, name: str, progress_q: Any) -> None:
        self.ctx = ctx
        self.name = name
        self.q = progress_q
        self.model = ctx.model
        self.initial = flat_params(ctx.model)
        self.pending = StepCounts()
        self.records: list[StepCounts] = []
        self.params: list[dict[str, torch.Tensor] | None] = []
        self.grads: list[dict[str, torch.Tensor] | None] = []
        self.lrs: list[list[float]] = []
        self.loss_sums: list[float] = []
        self.loss_counts: list[float] = []
        self._loss_sum = 0.0
        self._loss_count = 0.0
        self._snapshot_due = False
        self._tail_open = False
        self._opt_depth = 0
        self._sched_depth = 0
        self._zero_depth = 0
        self._observing = False
        self._interval = 0
        self._round_interval = -1
        self.engine = ""
        self.engine_info: dict[str, Any] = {}
        self.outer_optimizers: set[str] = set()
        self.notes: list[str] = []
        self.snapshot_failed: str | None = None
        self._wrapper: Any = None
        self._continuing = False
        self._undo: list[Callable[[], None]] = []
        self._comm_depth = 0
        self._engine_step_depth = 0
        self._ds_installed = False

    # -- installation ---------------------------------------------------------------
    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        try:
            self._install()
            yield
        finally:
            for undo in reversed(self._undo):
                with contextlib.suppress(Exception):
                    undo()
            self._undo.clear()

    def _patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        orig = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if orig is None:
            return
        setattr(owner, attr, make(getattr(owner, attr)))
        self._undo.append(lambda: setattr(owner, attr, orig))

    def _install(self) -> None:
        import torch.distributed as dist
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        h1 = register_optimizer_step_pre_hook(self._opt_pre)
        h2 = register_optimizer_step_post_hook(self._opt_post)
        h3 = self.model.register_forward_pre_hook(self._fwd_pre)
        h4 = self.model.register_forward_hook(self._fwd_post)
        for h in (h1, h2, h3, h4):
            self._undo.append(h.remove)
        self.ctx.on_loss = self._on_loss
        self._undo.append(lambda: setattr(self.ctx, "on_loss", None))
        for op in _REDUCE_OPS + _OTHER_OPS:
            if hasattr(dist, op):
                self._patch(dist, op, lambda orig, op=op: self._counting(orig, op in _REDUCE_OPS))
        if "deepspeed.comm.comm" in sys.modules:
            self._install_deepspeed()
        sched = torch.optim.lr_scheduler.LRScheduler
        self._patch(sched, "step", self._wrap_sched)
        self._patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero("optimizer"))
        self._patch(torch.nn.Module, "zero_grad", self._wrap_zero("module"))

    def _install_deepspeed(self) -> None:
        """Count at the deepspeed.comm level, and mark DeepSpeedEngine.step. Called at install
        when deepspeed is already imported, else at the first forward through a DeepSpeed
        engine (before any backward, so no gradient collective is missed)."""
        if self._ds_installed:
            return
        self._ds_installed = True
        for name in ("deepspeed.comm", "deepspeed.comm.comm"):
            mod = sys.modules.get(name)
            if mod is None:
                continue
            for op in _DS_REDUCE_OPS + _DS_OTHER_OPS:
                if callable(getattr(mod, op, None)):
                    self._patch(mod, op, lambda orig, op=op: self._counting(
                        orig, op in _DS_REDUCE_OPS))
        engine_mod = sys.modules.get("deepspeed.runtime.engine")
        engine_cls = getattr(engine_mod, "DeepSpeedEngine", None)
        if engine_cls is not None:
            self._patch(engine_cls, "step", self._wrap_engine_step)

    def _wrap_engine_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        obs = self

        def step(engine: Any, *args: Any, **kwargs: Any) -> Any:
            obs._engine_step_depth += 1
            try:
                return orig(engine, *args, **kwargs)
            finally:
                obs._engine_step_depth -= 1

        return step

    def _counting(self, orig: Callable[..., Any], reduces: bool) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            # Only the outermost call counts: deepspeed.comm calls torch.distributed, and
            # reduce_scatter_fn calls reduce_scatter_tensor.
            if self._observing or self._comm_depth:
                return orig(*args, **kwargs)
            if reduces and self._engine_step_depth:
                self.pending.step_reduce_calls += 1
            elif reduces and self.pending.backward > 0:
                self.pending.grad_collective_calls += 1
                self._mark_round()
            else:
                self.pending.other_collective_calls += 1
            self._comm_depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                self._comm_depth -= 1

        return wrapped

    def _wrap_sched(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        obs = self

        def step(sched: Any, *args: Any, **kwargs: Any) -> Any:
            # The constructor's initial step (``_step_count`` still 0) is not a training step.
            counted = getattr(sched, "_step_count", 0) > 0 and obs._sched_depth == 0
            obs._sched_depth += 1
            try:
                return orig(sched, *args, **kwargs)
            finally:
                obs._sched_depth -= 1
                if counted:
                    obs._tail_or_pending().scheduler_steps += 1

        return step

    def _wrap_zero(self, kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        obs = self

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            def zero_grad(this: Any, *args: Any, **kwargs: Any) -> Any:
                outer = obs._zero_depth == 0
                obs._zero_depth += 1
                try:
                    return orig(this, *args, **kwargs)
                finally:
                    obs._zero_depth -= 1
                    if outer and (kind == "optimizer" or this is obs.model
                                  or _owns(this, obs.model)):
                        target = obs._tail_or_pending()
                        target.zero_grad += 1
                        if target is obs.pending and obs.pending.backward > 0:
                            obs.pending.zero_grad_in_window += 1

            return zero_grad

        return make

    # -- events ------------------------------------------------------------------------
    def _tail_or_pending(self) -> StepCounts:
        return self.records[-1] if self._tail_open and self.records else self.pending

    def _mark_round(self) -> None:
        if self._round_interval != self._interval:
            self._round_interval = self._interval
            self.pending.grad_collective_rounds += 1

    def _on_loss(self, loss: Any, count: Any) -> None:
        with contextlib.suppress(Exception):
            self._loss_sum += float(loss.detach().float().sum())
            self._loss_count += float(torch.as_tensor(count).float().sum())
            self.pending.loss_calls += 1

    def _fwd_pre(self, module: Any, args: Any) -> None:
        if not torch.is_grad_enabled():
            return
        self._take_snapshot()
        self._tail_open = False
        self.pending.forward += 1
        kind, wrapper = _find_wrapper()
        self._ddp_sync = False
        if kind:
            self._note_engine(kind, wrapper)
        if kind == "ddp":
            self._ddp_sync = bool(getattr(wrapper, "require_backward_grad_sync", True))

    def _fwd_post(self, module: Any, args: Any, output: Any) -> None:
        if not torch.is_grad_enabled():
            return
        t = _first_grad_tensor(output)
        if t is None:
            return
        synced = getattr(self, "_ddp_sync", False)

        def on_grad(grad: torch.Tensor) -> None:
            self._interval += 1
            self._tail_open = False
            self.pending.backward += 1
            if synced:
                self.pending.ddp_sync_rounds += 1
                self._mark_round()

        t.register_hook(on_grad)

    def _note_engine(self, kind: str, wrapper: Any) -> None:
        if self.engine:
            return
        self.engine = kind
        self._wrapper = wrapper
        if kind == "deepspeed":
            self._install_deepspeed()
            with contextlib.suppress(Exception):
                self.engine_info = {
                    "zero_stage": int(wrapper.zero_optimization_stage()),
                    "gradient_accumulation_steps": int(wrapper.gradient_accumulation_steps()),
                    "gradient_clipping": float(wrapper.gradient_clipping() or 0.0),
                }

    def _opt_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth += 1
        if self._opt_depth > 1:
            return
        # DeepSpeed ZeRO-1/2 steps its inner optimizer once per parameter group, back to back:
        # with no forward/backward in between, it is the same optimizer step.
        self._continuing = (self.engine == "deepspeed" and bool(self.records)
                            and self._snapshot_due and self.pending.backward == 0
                            and self.pending.forward == 0)
        if self._continuing:
            more = self._capture_grads(opt)
            if more and self.grads and self.grads[-1] is not None:
                self.grads[-1].update(more)
            return
        self._take_snapshot()
        self._interval += 1
        self.outer_optimizers.add(type(opt).__name__)
        self.lrs.append([float(g.get("lr", float("nan"))) for g in opt.param_groups])
        self.grads.append(self._capture_grads(opt))

    def _opt_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth -= 1
        if self._opt_depth > 0 or self._continuing:
            self._continuing = False if self._opt_depth == 0 else self._continuing
            return
        self.pending.optimizer_steps += 1
        self.records.append(self.pending)
        self.pending = StepCounts()
        self.loss_sums.append(self._loss_sum)
        self.loss_counts.append(self._loss_count)
        self._loss_sum = self._loss_count = 0.0
        self.params.append(None)
        self._snapshot_due = True
        self._tail_open = True
        if self.q is not None:
            with contextlib.suppress(Exception):
                self.q.put((self.name, len(self.records)))

    def _capture_grads(self, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor] | None:
        names = {id(p): canonical_name(n) for n, p in self.model.named_parameters()}
        out: dict[str, torch.Tensor] = {}
        self._observing = True
        try:
            for group in opt.param_groups:
                for p in group["params"]:
                    name = names.get(id(p))
                    if name is None:
                        continue
                    g = p.grad
                    if g is None:
                        out[name] = torch.zeros(tuple(p.shape), dtype=torch.float64)
                        continue
                    g = g.detach()
                    if hasattr(g, "full_tensor"):
                        g = g.full_tensor()
                    out[name] = g.to("cpu", torch.float64).clone()
        finally:
            self._observing = False
        if not out and self.engine == "deepspeed":
            self._observing = True
            try:
                return self._capture_zero_partitions(opt, names)
            except Exception as exc:  # noqa: BLE001 - fall back to comparing updates only
                self.notes.append(f"could not gather DeepSpeed gradient partitions: {exc}")
                return None
            finally:
                self._observing = False
        return out or None

    def _capture_zero_partitions(self, opt: torch.optim.Optimizer,
                                 names: dict[int, str]) -> dict[str, torch.Tensor] | None:
        """DeepSpeed ZeRO-1/2: the inner optimizer holds this rank's flat fp32 partition of
        each parameter group. All-gather the partitions' gradients over the data-parallel
        group and cut the flat buffer back into parameters (per-parameter alignment padding
        after each, group padding at the end). ZeRO-3 and others: not observable (None)."""
        import torch.distributed as dist

        zopt = getattr(self._wrapper, "optimizer", None)
        parts = getattr(zopt, "single_partition_of_fp32_groups", None)
        groups = getattr(zopt, "round_robin_bit16_groups", None)
        paddings = getattr(zopt, "round_robin_bit16_padding", None)
        pgs = getattr(zopt, "real_dp_process_group", None)
        if parts is None or groups is None or pgs is None:
            return None
        mine = {id(p) for g in opt.param_groups for p in g["params"]}
        out: dict[str, torch.Tensor] = {}
        for i, part in enumerate(parts):
            if id(part) not in mine or part.grad is None:
                continue
            world = dist.get_world_size(pgs[i])
            pieces = [torch.empty_like(part.grad) for _ in range(world)]
            dist.all_gather(pieces, part.grad.detach().contiguous(), group=pgs[i])
            flat = torch.cat([x.reshape(-1) for x in pieces]).to("cpu", torch.float64)
            pads = paddings[i] if paddings is not None else [0] * len(groups[i])
            offset = 0
            for p, pad in zip(groups[i], pads, strict=True):
                n = p.numel() if not hasattr(p, "ds_numel") else p.ds_numel
                name = names.get(id(p))
                if name is not None:
                    out[name] = flat[offset:offset + n].reshape(tuple(p.shape)).clone()
                offset += n + pad
        return out or None

    def _take_snapshot(self) -> None:
        if not self._snapshot_due:
            return
        self._snapshot_due = False
        self._observing = True
        try:
            self.params[-1] = _gather_params(self.model)
        except Exception as exc:  # noqa: BLE001 - reported, the loop continues
            self.snapshot_failed = f"{type(exc).__name__}: {exc}"
        finally:
            self._observing = False

    def finish(self) -> None:
        self._take_snapshot()

    def result(self) -> dict[str, Any]:
        try:
            from torch.distributed.fsdp import FSDPModule

            if isinstance(self.model, FSDPModule):
                self.engine = self.engine or "fsdp2"
        except ImportError:  # pragma: no cover
            pass
        if "ZeroRedundancyOptimizer" in self.outer_optimizers:
            self.engine = "zero1"
        if not self.engine:
            import torch.distributed as dist

            self.engine = "local" if not (dist.is_initialized() and dist.get_world_size() > 1) \
                else "custom"
        dtypes = {str(p.dtype).replace("torch.", "") for p in self.model.parameters()}
        return {
            "name": self.name,
            "initial": self.initial,
            "params": self.params,
            "grads": self.grads,
            "lrs": self.lrs,
            "records": self.records,
            "trailing": self.pending,
            "loss_sums": self.loss_sums,
            "loss_counts": self.loss_counts,
            "engine": self.engine,
            "engine_info": self.engine_info,
            "outer_optimizers": sorted(self.outer_optimizers),
            "param_dtypes": sorted(dtypes),
            "snapshot_failed": self.snapshot_failed,
            "notes": list(dict.fromkeys(self.notes)),
        }


def _owns(module: Any, model: torch.nn.Module) -> bool:
    """Whether ``module`` wraps ``model`` (DDP / DeepSpeed engine ``.module``)."""
    return getattr(module, "module", None) is model


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    values: Any = ()
    if isinstance(output, dict):
        values = output.values()
    elif isinstance(output, (list, tuple)):
        values = output
    elif hasattr(output, "__dict__"):
        values = vars(output).values()
    for v in values:
        t = _first_grad_tensor(v)
        if t is not None:
            return t
    return None


# ----------------------------------------------------------------------------- comparison
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
           "float16": torch.float16}


def _rel(num: float, den: float) -> float:
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return num / den


def _grad_error(obs: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    num = sum(float((obs[k] - ref[k]).pow(2).sum()) for k in ref if k in obs)
    den = sum(float(ref[k].pow(2).sum()) for k in ref)
    return math.sqrt(_rel(num, den)) if den else (0.0 if num == 0 else float("inf"))


def _worst_param(initial: dict[str, torch.Tensor], obs: dict[str, torch.Tensor],
                 ref: dict[str, torch.Tensor]) -> tuple[str, float, float]:
    worst = ("", 0.0, -1.0)
    for k, t0 in initial.items():
        d_ref = ref[k] - t0
        diff = (obs[k] - ref[k]).abs()
        rel = _rel(float(diff.norm()), float(d_ref.norm()))
        if rel > worst[2]:
            worst = (k, float(diff.max()), rel)
    return worst


def _unit_roundoff(dtype: torch.dtype) -> float | None:
    return {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}.get(dtype)


def _update_tolerance(tol: float, u: float | None, step: int, initial: dict[str, torch.Tensor],
                      ref_params: dict[str, torch.Tensor]) -> float:
    """Low-precision weights are re-rounded at every step: allow (step+1)·u·‖θ‖/‖Δθ‖."""
    if u is None:
        return tol
    theta = math.sqrt(sum(float(t.pow(2).sum()) for t in ref_params.values()))
    delta = math.sqrt(sum(float((ref_params[k] - initial[k]).pow(2).sum()) for k in initial))
    return tol + (step + 1) * u * theta / max(delta, 1e-300)


def _build_report(name: str, setup: AuditSetup, obs: list[dict[str, Any]],
                  all_batches: list[list[Any]], world: int, reference_dtype: torch.dtype,
                  tolerance: float | None, diagnose: bool, duration: float,
                  ref: Any = None, cache: Any = None) -> AuditReport:
    k = setup.accumulation_steps
    o0 = obs[0]
    if ref is None:
        ref = _reference(setup, all_batches, reference_dtype)
    dtypes = o0["param_dtypes"]
    pdtype = _DTYPES.get(dtypes[0], torch.float32) if len(dtypes) == 1 else torch.float32
    if len(dtypes) > 1:
        pdtype = min((_DTYPES.get(d, torch.float32) for d in dtypes),
                     key=lambda d: torch.finfo(d).bits)
    tol, why = default_tolerance(pdtype, k)
    u = _unit_roundoff(pdtype)
    if tolerance is not None:
        tol, why, u = float(tolerance), "given by the caller", None
    elif u is not None:
        why += ("; updates also allow the weight rounding (s+1)·u·‖θ‖/‖Δθ‖ at step s, "
                "gradients are held to this tolerance")
    failures: list[str] = []
    notes: list[str] = []
    n_obs, n_ref = len(o0["params"]), len(ref.params)
    if n_obs != n_ref:
        failures.append(
            f"the loop took {n_obs} optimizer steps, the reference {n_ref} "
            f"({sum(len(b) for b in all_batches) // world} micro-batches per rank, K={k}): "
            + ("it steps more often than once per window of K micro-batches"
               if n_obs > n_ref else "it skips or merges windows (a dropped final window, or "
               "a counter that drifts)"))
    grads_seen = any(g is not None for g in o0["grads"])
    if not grads_seen and n_obs:
        notes.append("the gradient the optimizer receives is not observable here (its optimizer "
                     "holds flattened partitions that cannot be mapped back to parameters, e.g. "
                     "DeepSpeed ZeRO-3); only updates are compared")
    notes.extend(o0.get("notes", []))
    if o0["snapshot_failed"]:
        notes.append(f"parameter snapshot failed: {o0['snapshot_failed']}")
    # Do the ranks hold the same parameters after each step?
    rank_diff = 0.0
    for s in range(n_obs):
        for other in obs[1:]:
            if s < len(other["params"]) and other["params"][s] is not None \
                    and o0["params"][s] is not None:
                for key, t in o0["params"][s].items():
                    rank_diff = max(rank_diff, float((t - other["params"][s][key]).abs().max()))
    if rank_diff > 0 and any(len(o["params"]) != n_obs for o in obs):
        failures.append("ranks took different numbers of optimizer steps: "
                        f"{[len(o['params']) for o in obs]}")
    if rank_diff > 1e-6:
        failures.append(f"ranks hold different parameters after stepping (max |diff| "
                        f"{rank_diff:.3g}): gradients were not (fully) synchronised")
    steps: list[StepRecord] = []
    first: Divergence | None = None
    initial = {kk: v.double() for kk, v in ref.initial.items()}
    for s in range(n_obs):
        counts = o0["records"][s]
        lr = o0["lrs"][s] if s < len(o0["lrs"]) else None
        loss = None
        tot_n = sum(o["loss_counts"][s] for o in obs if s < len(o["loss_counts"]))
        if tot_n > 0:
            loss = sum(o["loss_sums"][s] for o in obs if s < len(o["loss_sums"])) / tot_n
        rec = StepRecord(step=s, update_error=None, grad_error=None, lr=lr, ref_lr=None,
                         loss=loss, ref_loss=None, counts=counts)
        p = o0["params"][s]
        if s < n_ref and p is not None:
            rp = ref.params[s]
            rec.ref_lr = list(ref.lrs[s])
            rec.ref_loss = ref.losses[s]
            rec.update_error = relative_update_error(initial, p, rp)
            if o0["grads"][s] is not None and ref.grads[s]:
                rec.grad_error = _grad_error(o0["grads"][s], ref.grads[s])
            wn, wabs, wrel = _worst_param(initial, p, rp)
            rec.worst_parameter, rec.max_abs_diff, rec.max_rel_diff = wn, wabs, wrel
            rec.update_tolerance = _update_tolerance(tol, u, s, initial, rp)
            bad = rec.update_error > rec.update_tolerance or (
                rec.grad_error is not None and rec.grad_error > tol)
            if bad and first is None:
                first = Divergence(step=s, parameter=wn, max_abs_diff=wabs, max_rel_diff=wrel,
                                   update_error=rec.update_error, grad_error=rec.grad_error)
        steps.append(rec)
    if first is not None:
        upd_tol = steps[first.step].update_tolerance or tol
        what = (f"relative update error {first.update_error:.3g} > tolerance {upd_tol:.3g}"
                if first.update_error > upd_tol else
                f"gradient error {first.grad_error:.3g} > tolerance {tol:.3g}")
        failures.insert(0, f"step {first.step}: {what} (worst parameter {first.parameter!r})")
    totals = StepCounts()
    for c in o0["records"]:
        totals.add(c)
    trailing = o0["trailing"]
    if n_obs and totals.forward == 0 and trailing.forward == 0:
        failures.insert(0, "the loop stepped an optimizer but never ran ctx.model's forward: "
                           "it must wrap and train ctx.model (the observed model), not a model "
                           "it builds itself")
    if trailing.backward:
        notes.append(f"{trailing.backward} backward pass(es) after the last optimizer step "
                     "never reached the optimizer")
    _count_notes(o0, k, notes, steps)
    use_obs_loss = steps and all(s.loss is not None for s in steps)
    losses = [s.loss for s in steps] if use_obs_loss else list(ref.losses)
    report = AuditReport(
        name=name, passed=not failures, tolerance=tol, tolerance_reason=why, world_size=world,
        accumulation_steps=k, engine=o0["engine"], param_dtype=str(pdtype).replace("torch.", ""),
        reference_dtype=str(reference_dtype).replace("torch.", ""), optimizer_steps=n_obs,
        reference_steps=n_ref, steps=steps, totals=totals, first_divergence=first,
        failures=failures, notes=notes, losses=[float(x) for x in losses],
        loss_source="loop" if use_obs_loss else "reference", gradients_observed=grads_seen,
        ranks_max_param_diff=rank_diff, trailing_backward=trailing.backward,
        duration_s=duration, engine_info=dict(o0["engine_info"]))
    if not report.passed and diagnose:
        from accumguard.verify.diagnosis import diagnose as run_diagnosis

        try:
            report.diagnosis = run_diagnosis(setup, all_batches, obs, report, cache=cache)
        except Exception as exc:  # noqa: BLE001 - a failed diagnosis must not hide the verdict
            report.notes.append(f"diagnosis failed: {type(exc).__name__}: {exc}")
    return report


def _count_notes(o0: dict[str, Any], k: int, notes: list[str], steps: list[StepRecord]) -> None:
    """Say how each count was obtained, and flag suspicious per-step counts."""
    eng = o0["engine"]
    if eng == "ddp":
        notes.append("gradient collective rounds: DDP's reducer runs in C++, so a DDP sync round "
                     "is inferred from require_backward_grad_sync at forward time and counted "
                     "when that backward runs; Python-level reduce calls are counted directly")
    else:
        notes.append("gradient collectives: torch.distributed reduce calls (all_reduce, "
                     "reduce_scatter*, reduce) made after a backward, counted by a wrapper; a "
                     "round is one or more such calls between two backwards")
    if eng == "deepspeed":
        notes.append("DeepSpeed: collectives are counted at the deepspeed.comm level (once per "
                     "call, not again in torch.distributed); reduce calls inside engine.step() "
                     "(gradient-norm / overflow all-reduces) are not gradient reductions and are "
                     "counted apart as step_reduce_calls")
        notes.append("zero_grad of the DeepSpeed engine is DeepSpeed's own method and is not "
                     "counted; torch optimizer and module zero_grad are")
    rounds = [s.counts.grad_collective_rounds for s in steps]
    if rounds and max(rounds) > 1:
        notes.append(f"up to {max(rounds)} gradient collective rounds per optimizer step: "
                     "gradients are synchronised on micro-steps, not only at the boundary "
                     "(correct if the numbers match, but K× the communication)")
    sched = [s.counts.scheduler_steps for s in steps]
    if sched and max(sched) > 1:
        notes.append(f"up to {max(sched)} scheduler steps per optimizer step (expected 1)")
    zin = sum(s.counts.zero_grad_in_window for s in steps)
    if zin:
        notes.append(f"{zin} zero_grad call(s) inside accumulation windows (between backwards "
                     "of one optimizer step)")


def assert_passed(report: AuditReport) -> None:
    """Raise ``AssertionError`` with the report's failures if the audit did not pass."""
    if not report.passed:
        raise AssertionError(f"audit of {report.name!r} failed: " + "; ".join(report.failures))

