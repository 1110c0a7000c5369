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

Size (~660 lines): the audit's spawning, comparison and report assembly; the observer, tolerance, report types and hypotheses are already in their own modules. Known debt: the comparison could move out.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from accumguard.core.errors import ConfigError
from accumguard.verify._observer import Observer
from accumguard.verify.contract import AuditSetup, Loop, LoopContext
from accumguard.verify.reference import (
    _WRAPPERS,
    ReferenceRun,
    _single_thread,
    move_to,
    windows_for_reference,
)
from accumguard.verify.report import (
    AuditReport,
    Divergence,
    LoopObservation,
    StepCounts,
    StepRecord,
    Tolerance,
)
from accumguard.verify.tolerance import (
    FP32_TOLERANCE,
    build_tolerance,
    default_tolerance,
    dtype_of,
    precision_name,
    unit_roundoff,
    update_errors,
    update_scale,
    update_tolerance,
)

__all__ = [
    "AuditReport",
    "StepCounts",
    "StepRecord",
    "Divergence",
    "Tolerance",
    "LoopObservation",
    "audit",
    "audit_many",
    "assert_passed",
    "default_tolerance",
    "FP32_TOLERANCE",
]

ProgressFn = Callable[[str, int, int], None]


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


class _References:
    """The references of one audit_many call, computed on first use: the large batch in
    ``reference_dtype`` and, per low compute precision, the large batch at that precision
    (its distance from the first is the precision's own error on this model and data)."""

    def __init__(self, setup: AuditSetup, all_batches: list[list[Any]],
                 dtype: torch.dtype) -> None:
        self.setup, self.all_batches, self.dtype = setup, all_batches, dtype
        self._main: ReferenceRun | None = None
        self._floors: dict[torch.dtype, list[float]] = {}

    @property
    def main(self) -> ReferenceRun:
        if self._main is None:
            self._main = _reference(self.setup, self.all_batches, self.dtype)
        return self._main

    def floor(self, compute: torch.dtype) -> list[float]:
        """Per step: the larger of the update and gradient errors of the reference run with
        ``compute`` autocast (fp32 weights and gradients) against the main reference."""
        if compute not in self._floors:
            low = _reference(self.setup, self.all_batches, torch.float32, autocast=compute)
            ref = self.main
            init = {k: v.double() for k, v in ref.initial.items()}
            ups = update_errors(init, low.params, ref.params)
            out = []
            for s, up in enumerate(ups):
                g = _grad_error(low.grads[s], ref.grads[s])[0] if ref.grads[s] else 0.0
                out.append(max(up or 0.0, g))
            self._floors[compute] = out
        return self._floors[compute]


def _reference(setup: AuditSetup, all_batches: list[list[Any]], reference_dtype: torch.dtype,
               autocast: torch.dtype | None = None) -> ReferenceRun:
    """The single-process large-batch reference on the canonical K-windows of every epoch."""
    from accumguard.verify.reference import reference_run

    windows = windows_for_reference(all_batches, setup.accumulation_steps) * setup.epochs
    return reference_run(setup.build_model(), setup.make_optimizer, windows, setup.loss_fn,
                         make_scheduler=setup.make_scheduler, max_grad_norm=setup.max_grad_norm,
                         dtype=reference_dtype, autocast=autocast)


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
    return (total if steps is None else min(total, steps)) * setup.epochs


def _rank_batches(setup: AuditSetup, rank: int, world: int, steps: int | None) -> list[Any]:
    batches = list(setup.rank_batches(rank, world))
    if steps is not None:
        batches = batches[: steps * setup.accumulation_steps]
    return batches


def _all_rank_batches(setup: AuditSetup, world: int, steps: int | None) -> list[list[Any]]:
    return [_rank_batches(setup, r, world, steps) for r in range(world)]


def _rank_main(rank: int, world: int, setup: AuditSetup, names: list[str], fns: list[Loop],
               steps: int | None, q: Any) -> list[LoopObservation]:
    return _observe_loops(rank, world, setup, names, fns, steps, q)


def audit_device() -> torch.device:
    """This rank's compute device under the live process group: ``cuda:LOCAL_RANK`` under
    nccl, the CPU under gloo or without a group (the one decision,
    :func:`accumguard.runtime.launch.rank_device`). ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``
    come from torchrun or from the audit's own spawner; without them, the global ones."""
    import torch.distributed as dist

    from accumguard.runtime.launch import rank_device

    if not (dist.is_available() and dist.is_initialized()):
        return torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return rank_device(str(dist.get_backend()), local, local_world)


@contextlib.contextmanager
def _fp32_matmuls() -> Any:
    """TF32 off while loops are audited, then the previous settings back. With TF32 an
    "fp32" CUDA matmul or convolution rounds its inputs to a 10-bit mantissa (about 1e-3
    relative), far above the fp32 tolerance the report would state. Only CUDA reads
    these flags; on the CPU this changes nothing. A loop that switches TF32 back on is
    seen by the observer and judged at that precision (see ``Observer._note_precision``)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = False
    cudnn.allow_tf32 = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


def _observe_loops(rank: int, world: int, setup: AuditSetup, names: list[str],
                   fns: list[Loop], steps: int | None, q: Any,
                   device: torch.device | None = None) -> list[LoopObservation]:
    device = audit_device() if device is None else torch.device(device)
    out = []
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with _fp32_matmuls(), on_device:
        for key, fn in zip(names, fns, strict=True):
            # Built where the reference is built (the CPU, deterministic), then moved: the
            # loop starts from bit-identical weights on any device.
            model = setup.build_model().to(device)
            batches = _rank_batches(setup, rank, world, steps)
            if device.type != "cpu":
                batches = move_to(batches, device)
            ctx = LoopContext(rank=rank, world_size=world, setup=setup, model=model,
                              batches=batches, device=device)
            obs = Observer(ctx, key, q if rank == 0 else None)
            try:
                with obs.installed():
                    fn(ctx)
                    obs.finish()
            except BaseException as exc:  # noqa: BLE001 - re-raised with the loop's name
                raise RuntimeError(f"loop {key!r} raised on rank {rank}:\n"
                                   f"{traceback.format_exc()}") from exc
            out.append(obs.result())
    return out




# ----------------------------------------------------------------------------- comparison
def _strip_wrappers(name: str) -> str:
    """``name`` without any wrapper part (``block._orig_mod.w`` → ``block.w``), for matching
    names that a wrapper inserted below the root (a compiled or wrapped submodule)."""
    return ".".join(p for p in name.split(".") if p not in _WRAPPERS) or name


def _align(observed: dict[str, torch.Tensor],
           ref_keys: list[str]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``observed`` keyed like the reference, and the reference names it has no entry for.
    An exact name wins; otherwise a name equal after dropping wrapper parts anywhere
    (``_orig_mod``, ``module``, ...), if exactly one observed name maps there."""
    out: dict[str, torch.Tensor] = {}
    loose: dict[str, list[str]] = {}
    for k in observed:
        loose.setdefault(_strip_wrappers(k), []).append(k)
    missing = []
    for k in ref_keys:
        if k in observed:
            out[k] = observed[k]
        elif len(loose.get(_strip_wrappers(k), ())) == 1:
            out[k] = observed[loose[_strip_wrappers(k)][0]]
        else:
            missing.append(k)
    return out, missing


def _grad_error(obs: dict[str, torch.Tensor],
                ref: dict[str, torch.Tensor]) -> tuple[float, list[str]]:
    """Relative gradient error over the reference's parameters, and the reference names the
    observation lacks. A missing gradient is never counted as a match: with any name
    missing the error is ∞ (the caller reports which)."""
    aligned, missing = _align(obs, list(ref))
    if missing:
        return math.inf, missing
    num = sum(float((aligned[k].double() - ref[k].double()).pow(2).sum()) for k in ref)
    den = sum(float(ref[k].double().pow(2).sum()) for k in ref)
    if den == 0:
        return (0.0 if num == 0 else math.inf), []
    return math.sqrt(num / den), []


def _worst_param(initial: dict[str, torch.Tensor], obs: dict[str, torch.Tensor],
                 ref: dict[str, torch.Tensor], scale: float) -> tuple[str, float, float]:
    """The parameter whose update is most wrong: name, max |diff|, error relative to its own
    update (or, where the reference does not move it, to the run's update scale)."""
    worst = ("", 0.0, -1.0)
    for k, t0 in initial.items():
        d_ref = float((ref[k] - t0).norm())
        diff = (obs[k] - ref[k]).abs()
        num = float(diff.norm())
        den = d_ref if d_ref > 0 else scale
        rel = 0.0 if num == 0 else (num / den if den > 0 else math.inf)
        if rel > worst[2]:
            worst = (k, float(diff.max()), rel)
    return worst


def _lowest(dtypes: list[torch.dtype]) -> torch.dtype:
    return max(dtypes, key=unit_roundoff) if dtypes else torch.float32


def _precision(setup: AuditSetup, o0: LoopObservation) -> tuple[torch.dtype, torch.dtype,
                                                                 torch.dtype, str]:
    """(compute, accumulation, parameter) dtypes of the loop, and where they come from."""
    params = _lowest([dtype_of(d) for d in o0.param_dtypes])
    if setup.precision != "auto":
        compute, source = dtype_of(setup.precision), f"declared precision={setup.precision!r}"
    elif o0.compute_dtypes:
        compute = _lowest([dtype_of(d.rsplit(" ", 1)[-1]) for d in o0.compute_dtypes])
        source = "detected " + ", ".join(o0.compute_dtypes)
    else:
        compute, source = params, f"{precision_name(params)} parameters"
    compute = _lowest([compute, params])
    # A model that is low precision throughout keeps (and sums) its gradients in that dtype;
    # mixed precision done right accumulates in the fp32 (master) parameters' dtype.
    return compute, params, params, source


def _build_report(name: str, setup: AuditSetup, obs: list[LoopObservation],
                  all_batches: list[list[Any]], world: int, refs: _References,
                  tolerance: float | None, diagnose: bool, duration: float,
                  cache: Any = None) -> AuditReport:
    k = setup.accumulation_steps
    o0 = obs[0]
    ref = refs.main
    compute, accum, pdtype, source = _precision(setup, o0)
    failures: list[str] = []
    notes: list[str] = []
    if tolerance is not None:
        tol = Tolerance(grad=float(tolerance), weight_rounding=0.0,
                        compute=precision_name(compute), accumulation=precision_name(accum),
                        params=precision_name(pdtype), source="given by the caller",
                        reason="given by the caller", given=True)
    else:
        floor: list[float] = []
        if unit_roundoff(compute) > unit_roundoff(pdtype):
            try:
                floor = refs.floor(compute)
            except Exception as exc:  # noqa: BLE001 - fall back to the formula, say so
                notes.append(f"could not run the reference at {precision_name(compute)} "
                             f"compute ({type(exc).__name__}: {exc}); tolerance from u only")
                floor = [4 * unit_roundoff(compute)]
        tol = build_tolerance(compute=compute, accumulation=accum, params=pdtype,
                              accumulation_steps=k, world_size=world, source=source,
                              floor=floor)
    why = tol.reason if tol.given else f"{tol.reason} [{tol.source}]"
    n_obs, n_ref = len(o0.params), len(ref.params)
    m = sum(len(b) for b in all_batches) // world
    if n_obs != n_ref:
        failures.append(
            f"the loop took {n_obs} optimizer steps, the reference {n_ref} "
            f"({m} micro-batches per rank, K={k}"
            + (f", {setup.epochs} epochs" if setup.epochs > 1 else "") + "): "
            + ("it steps more often than once per window of K micro-batches"
               if n_obs > n_ref else "it skips or merges windows (a dropped final window, a "
               "counter that drifts, or steps that never received a gradient)"))
    grads_seen = any(g is not None for g in o0.grads)
    if not grads_seen and n_obs:
        if o0.foreign_params:
            notes.append("the optimizer holds none of ctx.model's parameters (master copies or "
                         "a rebuilt model?): its gradients cannot be matched by name; only the "
                         "updates of ctx.model are compared")
        else:
            notes.append("the gradient the optimizer receives is not observable here (its "
                         "optimizer holds flattened partitions that cannot be mapped back to "
                         "parameters, e.g. DeepSpeed ZeRO-3); only updates are compared")
    notes.extend(o0.notes)
    if o0.snapshot_failed:
        notes.append(f"parameter snapshot failed: {o0.snapshot_failed}")
    # Do the ranks hold the same parameters after each step?
    rank_diff = 0.0
    for s in range(n_obs):
        for other in obs[1:]:
            mine, theirs = o0.params[s], other.params[s] if s < len(other.params) else None
            if mine is not None and theirs is not None:
                for key, t in mine.items():
                    if key in theirs:
                        rank_diff = max(rank_diff, float((t - theirs[key]).abs().max()))
    if any(len(o.params) != n_obs for o in obs):
        failures.append("ranks took different numbers of optimizer steps: "
                        f"{[len(o.params) for o in obs]}")
    if rank_diff > 1e-6:
        failures.append(f"ranks hold different parameters after stepping (max |diff| "
                        f"{rank_diff:.3g}): gradients were not (fully) synchronised")
    initial = {kk: v.double() for kk, v in ref.initial.items()}
    keys = list(initial)
    # Observed snapshots keyed like the reference; a parameter that cannot be matched fails.
    params: list[dict[str, torch.Tensor] | None] = []
    unmatched: set[str] = set()
    for p in o0.params:
        if p is None:
            params.append(None)
            continue
        aligned, missing = _align(p, keys)
        unmatched.update(missing)
        params.append(None if missing else aligned)
    if unmatched:
        failures.append(f"parameters {sorted(unmatched)[:5]} of the reference were not found in "
                        f"the loop's model (it has {sorted(o0.initial)[:5]}...): the loop must "
                        "train ctx.model")
    scale = update_scale(initial, ref.params)
    errs = update_errors(initial, params[:n_ref], ref.params[:n_obs], scale)
    # Moved at all? Against the loop's own initial snapshot (same dtype, no rounding doubt).
    start, _ = _align(o0.initial, keys)
    moved = any(p is not None and any(not torch.equal(p[kk], start.get(kk, initial[kk]))
                                      for kk in keys) for p in params)
    if not moved and scale > 0:
        failures.append(f"no update: the parameters never moved ({n_obs} optimizer steps, "
                        f"{sum(c.gradless_steps for c in o0.records) + o0.trailing.gradless_steps}"
                        " optimizer.step() calls without any gradient); the reference moves "
                        f"them by up to {scale:.3g} per step")
    steps: list[StepRecord] = []
    first: Divergence | None = None
    missing_grads: set[str] = set()
    for s in range(n_obs):
        counts = o0.records[s]
        lr = o0.lrs[s] if s < len(o0.lrs) else None
        loss = None
        tot_n = sum(o.loss_counts[s] for o in obs if s < len(o.loss_counts))
        if tot_n > 0:
            loss = sum(o.loss_sums[s] for o in obs if s < len(o.loss_sums)) / tot_n
        rec = StepRecord(step=s, update_error=None, grad_error=None, lr=lr, ref_lr=None,
                         loss=loss, ref_loss=None, counts=counts)
        p = params[s]
        if s < n_ref and p is not None:
            rp = ref.params[s]
            rec.ref_lr = list(ref.lrs[s])
            rec.ref_loss = ref.losses[s]
            rec.update_error = errs[s]
            g = o0.grads[s]
            if g is not None and ref.grads[s]:
                rec.grad_error, miss = _grad_error(g, ref.grads[s])
                missing_grads.update(miss)
            wn, wabs, wrel = _worst_param(initial, p, rp, scale)
            rec.worst_parameter, rec.max_abs_diff, rec.max_rel_diff = wn, wabs, wrel
            rec.update_tolerance = update_tolerance(tol, s, initial, rp, scale)
            fl = (tol.floor[min(s, len(tol.floor) - 1)] if tol.floor else 0.0)
            rec.grad_tolerance = tol.grad + fl
            assert rec.update_error is not None
            bad = rec.update_error > rec.update_tolerance or (
                rec.grad_error is not None and rec.grad_error > rec.grad_tolerance)
            if bad and first is None:
                first = Divergence(step=s, parameter=wn, max_abs_diff=wabs, max_rel_diff=wrel,
                                   update_error=rec.update_error, grad_error=rec.grad_error)
        steps.append(rec)
    if missing_grads:
        failures.append(
            f"the optimizer's gradients for {len(missing_grads)} parameter(s) were not observed "
            f"({sorted(missing_grads)[:5]}): the gradient cannot be compared, so the audit fails "
            "rather than pass unchecked; observed names: "
            f"{sorted(next(g for g in o0.grads if g is not None))[:5]}")
    if first is not None:
        rec = steps[first.step]
        what = (f"relative update error {first.update_error:.3g} > tolerance "
                f"{rec.update_tolerance:.3g}"
                if rec.update_tolerance is not None and first.update_error > rec.update_tolerance
                else f"gradient error {first.grad_error:.3g} > tolerance "
                     f"{rec.grad_tolerance:.3g}")
        failures.insert(0, f"step {first.step}: {what} (worst parameter {first.parameter!r})")
    totals = StepCounts()
    for c in o0.records:
        totals.add(c)
    trailing = o0.trailing
    totals.gradless_steps += trailing.gradless_steps
    if n_obs and totals.forward == 0 and trailing.forward == 0:
        failures.insert(0, "the loop stepped an optimizer but never ran ctx.model's forward: "
                           "it must wrap and train ctx.model (the observed model), not a model "
                           "it builds itself")
    if trailing.backward:
        notes.append(f"{trailing.backward} backward pass(es) after the last optimizer step "
                     "never reached the optimizer")
    if totals.gradless_steps:
        notes.append(f"{totals.gradless_steps} optimizer.step() call(s) found no gradient at "
                     "all (a no-op for torch optimizers) and were not counted as steps")
    _count_notes(o0, notes, steps)
    use_obs_loss = bool(steps) and all(s.loss is not None for s in steps)
    losses = [s.loss for s in steps] if use_obs_loss else list(ref.losses)
    report = AuditReport(
        name=name, passed=not failures, tolerance=tol.grad, tolerance_reason=why,
        world_size=world, accumulation_steps=k, epochs=setup.epochs, engine=o0.engine,
        param_dtype=str(pdtype).replace("torch.", ""),
        compute_dtype=str(compute).replace("torch.", ""),
        reference_dtype=str(refs.dtype).replace("torch.", ""), optimizer_steps=n_obs,
        reference_steps=n_ref, steps=steps, totals=totals, first_divergence=first,
        failures=failures, notes=notes, losses=[float(x) for x in losses if x is not None],
        loss_source="loop" if use_obs_loss else "reference", gradients_observed=grads_seen,
        ranks_max_param_diff=rank_diff, trailing_backward=trailing.backward,
        duration_s=duration, tolerance_model=tol, parameters_moved=moved,
        engine_info=dict(o0.engine_info))
    if not report.passed and diagnose:
        from accumguard.verify.diagnosis import diagnose as run_diagnosis

        try:
            report.diagnosis = run_diagnosis(setup, all_batches, obs, report, cache=cache)
        except Exception as exc:  # noqa: BLE001 - a failed diagnosis must not hide the verdict
            report.notes.append(f"diagnosis failed: {type(exc).__name__}: {exc}")
    return report


def _count_notes(o0: LoopObservation, notes: list[str], steps: list[StepRecord]) -> None:
    """Say how each count was obtained, and flag suspicious per-step counts."""
    eng = o0.engine
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
