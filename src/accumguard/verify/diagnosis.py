"""Name the accumulation bug behind a failed audit.

Three readings, in this order:

1. **No update.** The parameters never moved while the reference's did (no
   optimizer step, or steps that never received a gradient: a sync flag disabled
   and never re-enabled on FSDP2, gradients cleared before the step): the finding
   is ``NO_UPDATE``, never "closest OK".
2. **Fit.** Each known failure class (``accumguard.core.taxonomy``) predicts what
   the optimizer receives. Every hypothesis (:mod:`accumguard.verify._hypotheses`)
   is simulated as a single-process loop in float64 on the same initial weights,
   per-rank micro-batches, optimizer, scheduler and clipping, and its predicted
   parameter trajectory is compared with the observed one (rank 0). The residual
   is the largest update error (relative to the update size, as in the audit) over
   the steps; a hypothesis that predicts another number of optimizer steps is not
   simulated (∞). Where a bug implies an unknown factor (a user who also divided by
   K, DeepSpeed's ``scale_wrt_gas``) the scale is fitted: least squares on the
   first gradient when observable, otherwise the best of 1, 1/K, K, 1/W, W. The
   best hypothesis under the threshold (1e-3, or 10× the audit tolerance if
   larger) is the diagnosis. Low-precision rounding (F12) cannot be predicted
   bit for bit; it is named when its predicted drift explains most of the
   observed error (basis ``"magnitude"``).
3. **Step pattern.** When no hypothesis fits, but the number of optimizer steps
   tells the mechanism (one per micro-step: F1 or F1b by the zero_grad counts;
   every K-th window under DeepSpeed GA = K: F14; windows of K±1: F13; the partial
   windows missing: F7), that is the finding, with residual None. Otherwise
   "unexplained", with the closest *finite* candidate (or none).

Hypotheses that predict the same numbers (F2 and F3: "last micro-batch only") are
told apart by the counts the audit observed.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from accumguard.core.taxonomy import TAXONOMY
from accumguard.verify._hypotheses import Hyp, Sim, chunks, hypotheses
from accumguard.verify.contract import AuditSetup
from accumguard.verify.reference import _single_thread
from accumguard.verify.report import AuditReport, Candidate, Diagnosis, LoopObservation
from accumguard.verify.tolerance import update_errors

__all__ = ["Candidate", "Diagnosis", "DiagnosisCache", "diagnose", "FIXES", "TITLES"]

# Titles and fixes come from the one taxonomy; the diagnosis only adds hypotheses.
TITLES = {k: c.title for k, c in TAXONOMY.items()}
FIXES = {k: c.fix for k, c in TAXONOMY.items()}


def _cand(id_: str, variant: str, residual: float, scale: float = 1.0,
          label: str = "1") -> Candidate:
    return Candidate(id_, variant, residual, scale, label, TITLES.get(id_, id_))


def _scale_label(s: float, k: int, w: int) -> str:
    named = {"1": 1.0, "1/K": 1.0 / k, "K": float(k), "1/W": 1.0 / w, "W": float(w),
             "1/K²": 1.0 / (k * k), "1/(K·W)": 1.0 / (k * w), "K·W": float(k * w)}
    for label, v in named.items():
        if abs(s - v) <= 0.02 * abs(v):
            return label if label == "1" else f"{label} = {v:.4g}"
    return f"{s:.4g}"


class DiagnosisCache:
    """Simulations shared by several diagnoses of the *same* setup and batches (one
    :func:`accumguard.verify.audit.audit_many` call): the predicted trajectories do not depend on
    the observed loop, so the second broken loop of a call re-simulates only its fitted
    scales. A cache used with another setup, other batches or another dtype is rebuilt."""

    def __init__(self) -> None:
        self._key: tuple[int, int, torch.dtype] | None = None
        self._sim: Sim | None = None

    def sim(self, setup: AuditSetup, all_batches: list[list[Any]], dtype: torch.dtype) -> Sim:
        key = (id(setup), id(all_batches), dtype)
        if self._sim is None or key != self._key:
            self._sim, self._key = Sim(setup, all_batches, dtype), key
        return self._sim

    @property
    def grad_evaluations(self) -> int:
        """Per-micro-batch backward passes run so far (what the cache saves)."""
        return 0 if self._sim is None else self._sim.grad_evaluations


def diagnose(setup: AuditSetup, all_batches: list[list[Any]],
             observations: list[LoopObservation], report: AuditReport, *,
             dtype: torch.dtype = torch.float64,
             cache: DiagnosisCache | None = None) -> Diagnosis:
    """Explain the observed run: no update, the best-fitting hypothesis, or the step pattern.

    ``observations`` are the per-rank observations of
    :func:`accumguard.verify.audit.audit` (rank 0's trajectory is fitted); ``report``
    is its :class:`~accumguard.verify.report.AuditReport` (counts, engine, tolerance).
    ``cache`` shares the simulations between diagnoses of one setup and one
    ``all_batches`` object (the audit passes one per call).
    """
    with _single_thread():
        sim = (cache or DiagnosisCache()).sim(setup, all_batches, dtype)
        return _diagnose(sim, setup, observations, report)


def _no_update(report: AuditReport, obs: LoopObservation, sim: Sim) -> Diagnosis:
    gradless = report.totals.gradless_steps
    ev = [f"the parameters never moved: {report.optimizer_steps} optimizer steps with a "
          f"gradient, {gradless} optimizer.step() call(s) without any "
          f"(reference: {report.reference_steps} steps that move them)"]
    if report.engine == "fsdp2" and gradless:
        variant = ("no gradient reached the optimizer: FSDP2 gradient sync disabled and never "
                   "re-enabled (set_requires_gradient_sync(False) on every micro-step)")
    elif gradless:
        variant = "optimizer.step() found no gradient (cleared before the step, or never synced)"
    elif report.optimizer_steps == 0:
        variant = "optimizer.step() never called on ctx.model's parameters"
    else:
        variant = "steps taken, but with zero gradients or a zero learning rate"
    ev += _evidence(report, obs, sim)
    return Diagnosis(explained=True, bug_id="NO_UPDATE", title=TITLES["NO_UPDATE"],
                     variant=variant, residual=None, scale=1.0, scale_label="1",
                     fix=FIXES["NO_UPDATE"], threshold=0.0, runner_up=None, closest=None,
                     basis="no update", candidates=[], evidence=ev)


def _diagnose(sim: Sim, setup: AuditSetup, observations: list[LoopObservation],
              report: AuditReport) -> Diagnosis:
    obs = observations[0]
    if not report.parameters_moved:
        return _no_update(report, obs, sim)
    observed = list(obs.params)
    lp = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(report.param_dtype)
    initial = {n: t.double() for n, t in obs.initial.items()}
    g0 = obs.grads[0] if obs.grads and obs.grads[0] is not None else None
    g0_flat = None
    if g0 is not None and all(n in g0 for n in sim.names):
        g0_flat = torch.cat([g0[n].reshape(-1).double() for n in sim.names])
    K, W, M, E = sim.K, sim.W, sim.M, sim.E

    # Low-precision weights re-round every update by u·|θ|, which swamps the differences
    # between hypotheses in the update; there the observed first gradient decides.
    by_grad = lp is not None and g0_flat is not None

    def distance(traj: list[dict[str, torch.Tensor]], first: torch.Tensor,
                 ref: list[Any], ref_first: torch.Tensor) -> float:
        """How far ``traj`` is from ``ref`` (relative to ``ref``'s update size)."""
        if len(traj) != len(ref) or any(p is None for p in ref) or not ref:
            return math.inf
        if by_grad:
            den = float(ref_first.norm())
            return float((ref_first - first).norm()) / den if den else math.inf
        errs = update_errors(initial, ref, traj)
        return max((e for e in errs if e is not None), default=math.inf)

    def residual(traj: list[dict[str, torch.Tensor]], first: torch.Tensor) -> float:
        if by_grad:
            assert g0_flat is not None
            if len(traj) != len(observed) or any(p is None for p in observed):
                return math.inf
            den = float(first.norm())
            return float((g0_flat - first).norm()) / den if den else math.inf
        return distance(traj, first, observed, first)

    tol = float(report.tolerance)
    sched_counts = [st.counts.scheduler_steps for st in report.steps]
    clip_seen = float(g0_flat.norm()) if g0_flat is not None else None
    hyps = hypotheses(setup, sim, lp, sched_counts=sched_counts, clip_seen=clip_seen)
    assert hyps[0].id == "OK"
    n_obs = len(observed)
    ok_run = sim.run(hyps[0], 1.0) if hyps[0].n_steps(M, K, E) == n_obs else None
    from_ok: dict[int, float] = {}
    cands: list[Candidate] = []
    for h in hyps:
        if h.n_steps(M, K, E) != n_obs:
            # Another number of optimizer steps cannot explain the run: not simulated.
            cands.append(_cand(h.id, h.variant, math.inf))
            continue
        best, runs = _fit(sim, h, residual, g0_flat, K, W)
        if ok_run is not None:
            from_ok[id(best)] = distance(*runs[best.scale], ok_run[0], ok_run[1])
        cands.append(best)
    # A hypothesis whose prediction is within the audit tolerance of the correct update's
    # (clipping at 1.0 when the norm stays below or barely above it, no scheduler effect)
    # cannot be told from the correct update at the precision the loop is held to: it
    # explains nothing, and a correct loop failing by rounding noise must read "OK", not F9.
    ok = next(c.residual for c in cands if c.id == "OK")
    cands = [c for c in cands if c.id == "OK" or not from_ok.get(id(c), math.inf) <= tol]
    # Ties (within the tolerance) go to the correct update.
    cands.sort(key=lambda c: (c.residual, c.id != "OK", c.id))
    if math.isfinite(ok) and cands[0].id != "OK" and cands[0].residual >= ok - tol:
        cands.sort(key=lambda c: (c.id != "OK" and c.residual >= ok - tol, c.residual,
                                  c.id != "OK", c.id))
    threshold = (max(1e-3, 2 * tol) if by_grad else max(1e-3, 10 * tol))
    evidence = _evidence(report, obs, sim)
    top = cands[0]
    runner = next((c for c in cands[1:] if c.id != top.id and math.isfinite(c.residual)), None)
    if math.isfinite(top.residual) and top.residual <= threshold:
        bug_id = _refine(top.id, report)
        return Diagnosis(explained=True, bug_id=bug_id, title=TITLES.get(bug_id, bug_id),
                         variant=top.variant, residual=top.residual, scale=top.scale,
                         scale_label=top.scale_label, fix=FIXES.get(bug_id, ""),
                         threshold=threshold, runner_up=runner, closest=None,
                         basis="gradient" if by_grad else "trajectory", candidates=cands,
                         evidence=evidence)
    floor = report.tolerance_model.floor if report.tolerance_model is not None else ()
    drift = _rounding_drift(cands, ok, from_ok, tol, max(floor, default=0.0) / 2)
    if drift is not None:
        evidence.append(f"the error ({ok:.2g} from the correct update) has the size of the "
                        f"drift {drift.variant} predicts ({from_ok.get(id(drift), math.nan):.2g}"
                        f" from the correct update; residual {drift.residual:.2g})")
        return Diagnosis(explained=True, bug_id="F12", title=TITLES["F12"],
                         variant=drift.variant, residual=drift.residual, scale=1.0,
                         scale_label="1", fix=FIXES["F12"], threshold=threshold,
                         runner_up=next((c for c in cands if c.id != "F12"
                                         and math.isfinite(c.residual)), None),
                         closest=None, basis="magnitude", candidates=cands, evidence=evidence)
    pattern = _step_pattern(report, sim, hyps, n_obs)
    if pattern is not None:
        bug_id, variant = pattern
        evidence.insert(0, f"step pattern: {n_obs} optimizer steps for {M} micro-batches per "
                           f"rank (K={K}, {E} epoch(s); reference {report.reference_steps}): "
                           f"{variant}")
        return Diagnosis(explained=True, bug_id=bug_id, title=TITLES.get(bug_id, bug_id),
                         variant=variant, residual=None, scale=1.0, scale_label="1",
                         fix=FIXES.get(bug_id, ""), threshold=threshold,
                         runner_up=runner if runner is None or runner.id != bug_id else None,
                         closest=None, basis="step pattern", candidates=cands,
                         evidence=evidence)
    finite = [c for c in cands if math.isfinite(c.residual)]
    if not finite:
        counts = sorted({(h.n_steps(M, K, E), h.id) for h in hyps})
        evidence.insert(0, f"{n_obs} optimizer steps; the known classes predict "
                           + ", ".join(f"{n} ({i})" for n, i in counts))
    return Diagnosis(explained=False, bug_id="unexplained", title="no known class fits",
                     variant="", residual=finite[0].residual if finite else None, scale=1.0,
                     scale_label="1",
                     fix="Compare the per-step counts and the first diverging parameter "
                         "with the reference; the loop does something none of the known "
                         "classes describe (or two of them at once).",
                     threshold=threshold, runner_up=finite[1] if len(finite) > 1 else None,
                     closest=finite[0] if finite else None,
                     basis="trajectory" if finite else "step pattern", candidates=cands,
                     evidence=evidence)


def _fit(sim: Sim, h: Hyp, residual: Any, g0_flat: torch.Tensor | None, K: int,
         W: int) -> tuple[Candidate, dict[float, tuple[Any, torch.Tensor]]]:
    """The best scale for ``h`` and its candidate; the runs per scale tried."""
    scales = list(h.fixed_scales)
    traj, first = sim.run(h, scales[0])
    tried = {scales[0]: residual(traj, first)}
    runs = {scales[0]: (traj, first)}
    if h.partial_scale:
        scales.extend(_search_partial_scale(sim, h, residual, K))
    elif h.scale_fit:
        if g0_flat is not None and float(first.norm()) > 0:
            unit = first / scales[0]
            s = float(g0_flat @ unit / (unit @ unit))
            if s > 0 and abs(s - 1) > 1e-6:
                scales.append(s)
        else:
            scales += [1.0 / K, float(K), 1.0 / W, float(W), 1.0 / (K * K)]
    for s in scales:
        if s not in tried:
            runs[s] = sim.run(h, s)
            tried[s] = residual(*runs[s])
    best: Candidate | None = None
    for s, res in tried.items():
        c = _cand(h.id, h.variant, res, s, _scale_label(s, K, W))
        if best is None or res < best.residual:
            best = c
    assert best is not None
    return best, runs


def _search_partial_scale(sim: Sim, h: Hyp, residual: Any, K: int) -> list[float]:
    """Scales of the partial window worth trying: the first gradient is a full window's, so
    the scale is searched on the trajectory (golden section on log s over [1/(4K), 4K] after a
    coarse grid; the residual of one scaled window is unimodal in practice). Runs that
    retrace the correct trajectory up to the partial window reuse its cached gradients."""
    def f(x: float) -> float:
        return float(residual(*sim.run(h, math.exp(x))))

    lo, hi = math.log(1.0 / (4 * K)), math.log(4.0 * K)
    grid = [lo + (hi - lo) * i / 12 for i in range(13)]
    vals = [f(x) for x in grid]
    if not any(math.isfinite(v) for v in vals):
        return []
    i = min(range(len(grid)), key=lambda j: vals[j])
    a, b = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    phi = (math.sqrt(5) - 1) / 2
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(30):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = f(d)
    return [math.exp(grid[i]), math.exp((a + b) / 2)]


def _rounding_drift(cands: list[Candidate], ok: float, from_ok: dict[int, float],
                    tol: float, compute_floor: float) -> Candidate | None:
    """F12 when low-precision accumulation predicts a drift of the observed size. Rounding
    cannot be replayed bit for bit, and the loop's low-precision *compute* error
    (``compute_floor``, measured by the audit) is in the observation but not in the fp64
    prediction: the hypothesis must leave at most that floor plus half the observed error
    unexplained, and predict a drift of the same order (within 3×) as the observed error."""
    if not math.isfinite(ok) or ok <= tol:
        return None
    for c in cands:
        if c.id != "F12" or not math.isfinite(c.residual):
            continue
        d = from_ok.get(id(c), math.inf)
        if c.residual <= 0.5 * ok + compute_floor and ok / 3 <= d <= 3 * ok:
            return c
    return None


def _step_pattern(report: AuditReport, sim: Sim, hyps: list[Hyp],
                  n_obs: int) -> tuple[str, str] | None:
    """The class the number of optimizer steps points to, when it points to one."""
    K, M, E = sim.K, sim.M, sim.E
    if n_obs == report.reference_steps or K == 1:
        return None
    steps = report.steps
    if n_obs == M * E:
        zero = [s.counts.zero_grad for s in steps]
        if sum(1 for z in zero if z > 0) <= math.ceil(n_obs / K) and any(zero):
            return "F1b", ("one optimizer step per micro-batch, zero_grad only every K-th: "
                           "each step applies the running partial sum")
        return "F1", "one optimizer step (and zero_grad) per micro-batch"
    info = report.engine_info or {}
    f14 = next((h for h in hyps if h.id == "F14"), None)
    if f14 is not None and n_obs == f14.n_steps(M, K, E) and (
            report.engine != "deepspeed" or info.get("gradient_accumulation_steps") == K):
        return "F14", ("an optimizer step every K-th window only: the engine counts K micro-"
                       "steps and the loop calls step() once per K micro-batches")
    for d in (-1, 1):
        if K + d >= 1 and n_obs == len(chunks(M, K + d)) * E:
            return "F13", f"windows of K{d:+d} = {K + d} micro-steps"
    if M % K and n_obs == (M // K) * E:
        return "F7", "the final partial window of each epoch is never stepped on its own"
    return None


def _evidence(report: AuditReport, obs: LoopObservation, sim: Sim) -> list[str]:
    ev = []
    steps = report.optimizer_steps
    if steps and steps != report.reference_steps:
        ev.append(f"{steps} optimizer steps for {sim.M} micro-batches per rank "
                  f"(reference: {report.reference_steps})")
    zin = report.totals.zero_grad_in_window
    if zin:
        ev.append(f"{zin} zero_grad call(s) between backwards of one window")
    if report.totals.gradless_steps:
        ev.append(f"{report.totals.gradless_steps} optimizer.step() call(s) found no gradient")
    sched = [s.counts.scheduler_steps for s in report.steps]
    if sched and max(sched) > 1:
        ev.append(f"up to {max(sched)} scheduler steps per optimizer step")
    for rec in report.steps:
        if rec.lr and rec.ref_lr and len(rec.lr) == len(rec.ref_lr) and any(
                abs(a - b) > 1e-9 * max(abs(b), 1e-12) for a, b in zip(rec.lr, rec.ref_lr,
                                                                      strict=True)):
            ev.append(f"step {rec.step}: LR used {rec.lr[0]:.4g}, reference LR "
                      f"{rec.ref_lr[0]:.4g}")
            break
    if report.ranks_max_param_diff > 1e-6:
        ev.append(f"ranks disagree after stepping (max |diff| {report.ranks_max_param_diff:.2g})")
    if report.compute_dtype != report.param_dtype:
        ev.append(f"compute in {report.compute_dtype}, parameters in {report.param_dtype}")
    info = report.engine_info or {}
    if report.engine == "deepspeed":
        ev.append(f"DeepSpeed ZeRO-{info.get('zero_stage', '?')}, config "
                  f"gradient_accumulation_steps={info.get('gradient_accumulation_steps', '?')}, "
                  f"gradient_clipping={info.get('gradient_clipping', '?')}")
    return ev


def _refine(bug_id: str, report: AuditReport) -> str:
    """Tell apart classes that predict the same numbers, from the observed counts."""
    if bug_id != "F2/F3":
        return bug_id
    if report.totals.zero_grad_in_window > 0:
        return "F3"
    info = report.engine_info or {}
    if report.engine == "deepspeed" and info.get("gradient_accumulation_steps") == 1 \
            and report.accumulation_steps > 1:
        return "F2"
    return "F2/F3"
