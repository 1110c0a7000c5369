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
``torchrun``). On every rank the loop runs on a fresh ``setup.build_model()`` (built on
the CPU, then moved with the batches to the rank's device, :func:`audit_device`; TF32 off)
under an :class:`~accumguard.verify._observer.Observer` that needs no cooperation
from the loop. The parent process computes the fp64 reference
(:func:`accumguard.verify.reference.reference_run` on the canonical K-windows of
every epoch), compares step by step with a tolerance that follows the numerics
(:mod:`accumguard.verify.tolerance`), and on failure runs the diagnosis
(:mod:`accumguard.verify.diagnosis`). The report types live in
:mod:`accumguard.verify.report`.

The spawning lives in ``_audit_spawn``, the comparison and the report assembly in
``_audit_compare``; the observer, tolerance, report types and hypotheses have their own
modules too.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from accumguard.core.errors import ConfigError
from accumguard.verify._audit_compare import _build_report, _References
from accumguard.verify._audit_compare import _grad_error as _grad_error
from accumguard.verify._audit_compare import _precision as _precision
from accumguard.verify._audit_spawn import ProgressFn as ProgressFn
from accumguard.verify._audit_spawn import (
    _all_rank_batches,
    _loop_name,
    _spawn,
    audit_device,
)
from accumguard.verify._audit_spawn import _observe_loops as _observe_loops
from accumguard.verify.contract import AuditSetup, Loop
from accumguard.verify.reference import _single_thread
from accumguard.verify.report import (
    AuditReport,
    AuditStep,
    Divergence,
    LoopObservation,
    Tolerance,
)
from accumguard.verify.tolerance import FP32_TOLERANCE, default_tolerance

__all__ = [
    "AuditReport",
    "AuditStep",
    "Divergence",
    "Tolerance",
    "LoopObservation",
    "audit",
    "audit_many",
    "assert_passed",
    "default_tolerance",
    "FP32_TOLERANCE",
]


def __getattr__(name: str) -> object:
    """``StepCounts`` and ``StepRecord``, the report types' old names: one more release, with
    a DeprecationWarning (:mod:`accumguard.verify.report` says what replaced them)."""
    if name in ("StepCounts", "StepRecord"):
        from accumguard.verify import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        device = audit_device()
        mine = _observe_loops(rank, world, setup, names, fns, steps, None, device)
        gathered: list[Any] = [None] * world
        # all_gather_object stages through the *current* CUDA device under nccl: make it
        # this rank's, in case the caller never called set_device.
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
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
        refs = _References(setup, all_batches, reference_dtype)
        # Likewise the diagnosis's simulations, shared by the broken loops of this call.
        from accumguard.verify.diagnosis import DiagnosisCache

        cache = DiagnosisCache()
        for i, key in enumerate(names):
            obs = [per_rank[r][i] for r in range(world)]
            reports[key] = _build_report(key, setup, obs, all_batches, world, refs,
                                         tolerance, diagnose, elapsed / len(names), cache)
    return reports


def assert_passed(report: AuditReport) -> None:
    """Raise ``AssertionError`` with the report's failures if the audit did not pass."""
    if not report.passed:
        raise AssertionError(f"audit of {report.name!r} failed: " + "; ".join(report.failures))
