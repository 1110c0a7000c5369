"""The audit's comparison: the loop's observed steps against the fp64 reference.

The references of one call (computed once), the alignment of parameter names across
wrappers, the update and gradient errors per step with the tolerance model, and the
:class:`~accumguard.verify.report.AuditReport` they make, diagnosed on failure.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from accumguard.core.window import StepRecord, sum_records
from accumguard.verify.contract import AuditSetup
from accumguard.verify.reference import (
    _WRAPPERS,
    ReferenceRun,
    windows_for_reference,
)
from accumguard.verify.report import (
    AuditReport,
    AuditStep,
    Divergence,
    LoopObservation,
    Tolerance,
)
from accumguard.verify.tolerance import (
    build_tolerance,
    dtype_of,
    precision_name,
    unit_roundoff,
    update_errors,
    update_scale,
    update_tolerance,
)


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
    steps: list[AuditStep] = []
    first: Divergence | None = None
    missing_grads: set[str] = set()
    for s in range(n_obs):
        counts = o0.records[s]
        lr = o0.lrs[s] if s < len(o0.lrs) else None
        loss = None
        tot_n = sum(o.loss_counts[s] for o in obs if s < len(o.loss_counts))
        if tot_n > 0:
            loss = sum(o.loss_sums[s] for o in obs if s < len(o.loss_sums)) / tot_n
        rec = AuditStep(step=s, update_error=None, grad_error=None, lr=lr, ref_lr=None,
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
    trailing = o0.trailing
    totals = sum_records([*o0.records, StepRecord(step=0, optimizer_steps=0,
                                                  gradless_steps=trailing.gradless_steps)])
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


def _count_notes(o0: LoopObservation, notes: list[str], steps: list[AuditStep]) -> None:
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
