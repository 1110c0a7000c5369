"""Name the accumulation bug behind a failed audit.

Each known failure class (F1-F13 in ``docs/audit.md``) predicts what the
optimizer receives. We *simulate* every hypothesis as a single-process loop in
float64 on the same initial weights and the same per-rank micro-batches, with
the same optimizer, scheduler and clipping, and compare the trajectory it
predicts with the observed one (parameters after every optimizer step of
rank 0). The residual of a hypothesis is the largest relative update error
between prediction and observation over the steps; a hypothesis that predicts a
different number of optimizer steps has residual ∞.

Where a bug implies an unknown factor (a user who also divided by K, a
DeepSpeed ``scale_wrt_gas``), the hypothesis gets a fitted scale: the least
squares factor between the observed and the predicted first gradient when the
gradient is observable, otherwise the best of 1, 1/K, K, 1/W, W.

The best hypothesis whose residual is under a threshold (1e-3, or 10× the audit
tolerance if larger: an exact hypothesis matches to fp32 rounding, ~1e-6, and
the classes differ from each other by ≥ 1e-2 on the toy data) is the
diagnosis; if none is, the diagnosis says "unexplained" and shows the closest.
Hypotheses that predict the same numbers (F2 and F3: "last micro-batch
only") are told apart by the counts the audit observed.
"""

from __future__ import annotations

import copy
import hashlib
import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from accumguard.core.taxonomy import TAXONOMY
from accumguard.verify.contract import AuditSetup
from accumguard.verify.reference import (
    _single_thread,
    canonical_name,
    cast_floats,
    relative_update_error,
)

__all__ = ["Candidate", "Diagnosis", "DiagnosisCache", "diagnose", "FIXES", "TITLES"]

# Titles and fixes come from the one taxonomy; the diagnosis only adds hypotheses.
TITLES = {k: c.title for k, c in TAXONOMY.items()}
FIXES = {k: c.fix for k, c in TAXONOMY.items()}


@dataclass
class Candidate:
    """One hypothesis (class + variant) and how well it explains the observation."""

    id: str
    variant: str
    residual: float
    scale: float = 1.0
    scale_label: str = "1"

    @property
    def title(self) -> str:
        return TITLES.get(self.id, self.id)


@dataclass
class Diagnosis:
    """The best-explaining failure class, the runner-up, and the fix.

    ``explained`` is False when no hypothesis fits under ``threshold``: then
    ``bug_id`` is ``"unexplained"`` and ``closest`` names the nearest class.
    """

    explained: bool
    bug_id: str
    title: str
    variant: str
    residual: float
    scale: float
    scale_label: str
    fix: str
    threshold: float
    runner_up: Candidate | None
    closest: Candidate | None
    candidates: list[Candidate] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for a terminal or a CI log."""
        if not self.explained:
            near = (f"; closest {self.closest.id} ({self.closest.title}) residual "
                    f"{self.closest.residual:.2g}" if self.closest else "")
            return f"unexplained: no known failure class fits under {self.threshold:.0e}{near}"
        scale = "" if self.scale_label == "1" else f", fitted scale {self.scale_label}"
        return (f"{self.bug_id}: {self.title} ({self.variant}{scale}; residual "
                f"{self.residual:.2g})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("runner_up", "closest"):
            c = getattr(self, key)
            if c is not None:
                d[key]["title"] = c.title
        return d


# ----------------------------------------------------------------------------- simulation
class _Win:
    """What a hypothesis's gradient formula may use for one optimizer step."""

    def __init__(self, sim: _Sim, idx: list[int], replicas: list[Any]) -> None:
        self.sim = sim
        self.idx = idx
        self.L = len(idx)
        self.W = sim.W
        self.K = sim.K
        self._replicas = replicas
        self._cache: dict[tuple[int, int], torch.Tensor] = {}
        self._digests: dict[int, bytes] = {}

    def g(self, r: int, j: int) -> torch.Tensor:
        """Flat gradient of the *summed* loss of micro-batch ``idx[j]`` of rank ``r``,
        at rank r's replica (replica 0 when the hypothesis keeps ranks identical)."""
        key = (r, j)
        if key not in self._cache:
            which = r if len(self._replicas) > 1 else 0
            rep = self._replicas[which]
            if which not in self._digests:
                self._digests[which] = _digest(rep[0])
            self._cache[key] = self.sim.grad(rep, r, self.idx[j], self._digests[which])
        return self._cache[key]

    def n(self, r: int, j: int) -> float:
        return self.sim.counts[r][self.idx[j]]

    @property
    def N(self) -> float:
        return sum(self.n(r, j) for r in range(self.W) for j in range(self.L))

    def Nr(self, r: int) -> float:
        return sum(self.n(r, j) for j in range(self.L))

    def correct(self) -> torch.Tensor:
        return sum(self.g(r, j) for r in range(self.W) for j in range(self.L)) / self.N


Combine = Callable[[_Win], list[torch.Tensor]]


@dataclass(frozen=True)
class _Hyp:
    id: str
    variant: str
    combine: Combine
    windows: Callable[[int, int], list[list[int]]] | None = None
    per_rank: bool = False
    sched_per_step: Callable[[int], int] | None = None
    sched_before: Callable[[int], int] | None = None
    clip: float | None | str = "setup"
    scale_fit: bool = False
    fixed_scales: tuple[float, ...] = (1.0,)


def _chunks(m: int, k: int) -> list[list[int]]:
    return [list(range(s, min(s + k, m))) for s in range(0, m, k)]


def _digest(model: torch.nn.Module) -> bytes:
    """Fingerprint of a replica's weights (and buffers): equal fingerprints, equal gradients
    on the same micro-batch (the simulation is deterministic, single-threaded)."""
    h = hashlib.blake2b(digest_size=16)
    for t in list(model.parameters()) + list(model.buffers()):
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.digest()


def _clip(v: torch.Tensor, max_norm: float | None) -> torch.Tensor:
    if max_norm is None:
        return v
    norm = float(v.norm())
    # Same factor as torch.nn.utils.clip_grad_norm_.
    coef = max_norm / (norm + 1e-6)
    return v * coef if coef < 1 else v


class _Sim:
    def __init__(self, setup: AuditSetup, batches: list[list[Any]], dtype: torch.dtype) -> None:
        self.setup = setup
        self.dtype = dtype
        self.batches = [[cast_floats(b, dtype) for b in rank] for rank in batches]
        self.W = len(batches)
        self.M = len(batches[0])
        self.K = setup.accumulation_steps
        self.base = setup.build_model().to(dtype)
        self.names = [canonical_name(n) for n, _ in self.base.named_parameters()]
        self.shapes = [p.shape for p in self.base.parameters()]
        self.counts = [[self._count(b) for b in rank] for rank in self.batches]
        # Per-micro-batch gradients g(r, i) are what every hypothesis spends its time on, and
        # all hypotheses start from the same weights; those at the initial weights and along
        # the correct trajectory (which inactive or scale-1 hypotheses retrace) are kept, keyed
        # on the weights' fingerprint: at most 2·W·M gradients.
        self._keep: set[bytes] = {_digest(self.base)}
        self._grads: dict[tuple[bytes, int, int], torch.Tensor] = {}
        self._remember = False
        # Whole predicted trajectories, per (hypothesis, variant, scale): they do not depend
        # on the observation, so several diagnoses of one audit_many call share them.
        self.runs: dict[tuple[str, str, float], tuple[list[dict[str, torch.Tensor]],
                                                       torch.Tensor]] = {}
        self.grad_evaluations = 0

    def _count(self, batch: Any) -> float:
        if self.setup.count_fn is not None:
            return float(torch.as_tensor(self.setup.count_fn(batch)).sum())
        with torch.no_grad():
            return float(torch.as_tensor(self.setup.loss_fn(self.base, batch)[1]).sum())

    def replica(self) -> tuple[torch.nn.Module, Any, Any]:
        model = copy.deepcopy(self.base)
        opt = self.setup.make_optimizer([p for p in model.parameters()])
        sched = self.setup.make_scheduler(opt) if self.setup.make_scheduler else None
        return model, opt, sched

    def grad(self, rep: tuple[torch.nn.Module, Any, Any], r: int, i: int,
             digest: bytes | None = None) -> torch.Tensor:
        if digest is not None:
            if self._remember:
                self._keep.add(digest)
            hit = self._grads.get((digest, r, i))
            if hit is not None:
                return hit
        g = self._grad(rep, r, i)
        if digest is not None and digest in self._keep:
            self._grads[(digest, r, i)] = g
        return g

    def _grad(self, rep: tuple[torch.nn.Module, Any, Any], r: int, i: int) -> torch.Tensor:
        self.grad_evaluations += 1
        model = rep[0]
        for p in model.parameters():
            p.grad = None
        s, _ = self.setup.loss_fn(model, self.batches[r][i])
        s.backward()
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in model.parameters()]).detach().clone()

    def apply(self, rep: tuple[torch.nn.Module, Any, Any], vec: torch.Tensor,
              sched_steps: int, sched_before: int = 0) -> None:
        model, opt, sched = rep
        if sched is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
                for _ in range(sched_before):
                    sched.step()
        off = 0
        for p in model.parameters():
            n = p.numel()
            p.grad = vec[off:off + n].view_as(p).to(p.dtype).clone()
            off += n
        opt.step()
        if sched is not None:
            for _ in range(sched_steps):
                sched.step()

    def params(self, rep: tuple[torch.nn.Module, Any, Any]) -> dict[str, torch.Tensor]:
        return {n: p.detach().double().clone() for n, p in zip(self.names, rep[0].parameters(),
                                                             strict=True)}

    def run(self, h: _Hyp, scale: float) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
        """Predicted trajectory (parameters after each step) and first clipped gradient;
        memoised per (class, variant, scale). The results are shared: do not modify them."""
        key = (h.id, h.variant, float(scale))
        if key not in self.runs:
            # The correct update at scale 1 is the trajectory others most often retrace.
            self._remember = h.id == "OK" and scale == 1.0
            try:
                self.runs[key] = self._run(h, scale)
            finally:
                self._remember = False
        return self.runs[key]

    def _run(self, h: _Hyp, scale: float) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
        wins = (h.windows or _chunks)(self.M, self.K)
        reps = [self.replica() for _ in range(self.W if h.per_rank else 1)]
        traj = []
        first: torch.Tensor | None = None
        clip = self.setup.max_grad_norm if h.clip == "setup" else h.clip
        for idx in wins:
            w = _Win(self, idx, reps)
            vecs = h.combine(w)
            if first is None:
                first = _clip(vecs[0] * scale, clip)  # type: ignore[arg-type]
            after = h.sched_per_step(len(idx)) if h.sched_per_step else 1
            before = h.sched_before(len(idx)) if h.sched_before else 0
            for rep, v in zip(reps, vecs, strict=True):
                self.apply(rep, _clip(v * scale, clip), after, before)  # type: ignore[arg-type]
            traj.append(self.params(reps[0]))
        assert first is not None
        return traj, first


# ----------------------------------------------------------------------------- hypotheses
def _rank_mean(w: _Win, f: Callable[[int], torch.Tensor]) -> torch.Tensor:
    return sum(f(r) for r in range(w.W)) / w.W


def _hypotheses(setup: AuditSetup, sim: _Sim, low_precision: torch.dtype | None) -> list[_Hyp]:
    K, W, M = sim.K, sim.W, sim.M
    last = lambda w: w.L - 1  # noqa: E731
    hs = [
        _Hyp("OK", "sum over the window / global count", lambda w: [w.correct()]),
        _Hyp("F1", "each micro-step's rank-mean loss",
             lambda w: [_rank_mean(w, lambda r: w.g(r, 0) / w.n(r, 0))],
             windows=lambda m, k: [[i] for i in range(m)], scale_fit=True),
        _Hyp("F1", "each micro-step's global token mean", lambda w: [w.correct()],
             windows=lambda m, k: [[i] for i in range(m)], scale_fit=True),
        _Hyp("F2/F3", "last micro-batch, its rank-mean loss",
             lambda w: [_rank_mean(w, lambda r: w.g(r, last(w)) / w.n(r, last(w)))],
             scale_fit=True),
        _Hyp("F2/F3", "last micro-batch, divided by the window's count",
             lambda w: [sum(w.g(r, last(w)) for r in range(w.W)) / w.N], scale_fit=True),
        _Hyp("F2/F3", "last micro-batch, divided by its own count over ranks",
             lambda w: [sum(w.g(r, last(w)) for r in range(w.W))
                        / sum(w.n(r, last(w)) for r in range(w.W))], scale_fit=True),
        _Hyp("F10", "×W / ÷W", lambda w: [w.correct()], fixed_scales=(float(W), 1.0 / W)),
    ]
    # With equal counts everywhere a mean of means is exact: F5 is no bug there (and on a
    # partial window it would predict exactly what F7 predicts).
    uneven = len({c for rank in sim.counts for c in rank}) > 1
    if uneven:
        hs.append(_Hyp("F5", "Σ_i (g_i/n_i)/K, averaged over ranks",
                       lambda w: [_rank_mean(w, lambda r: sum(w.g(r, j) / w.n(r, j)
                                                              for j in range(w.L)) / w.K)]))
    if M % K and uneven:
        hs.append(_Hyp("F5", "Σ_i (g_i/n_i)/len(window), averaged over ranks",
                       lambda w: [_rank_mean(w, lambda r: sum(w.g(r, j) / w.n(r, j)
                                                              for j in range(w.L)) / w.L)]))
    if M % K:
        hs.append(_Hyp("F7", "partial window divided by K",
                       lambda w: [w.correct() * (w.L / w.K)]))
        hs.append(_Hyp("F7", "partial window dropped", lambda w: [w.correct()],
                       windows=lambda m, k: _chunks(m - m % k, k)))
    if W > 1:
        hs.append(_Hyp("F6", "rank-local sum / rank-local count, averaged over ranks",
                       lambda w: [_rank_mean(w, lambda r: sum(w.g(r, j) for j in range(w.L))
                                             / w.Nr(r))]))
        for norm in ("global", "mean"):
            def ell(w: _Win, r: int, j: int, norm: str = norm) -> torch.Tensor:
                if norm == "global":
                    return w.g(r, j) * w.W / w.N
                return w.g(r, j) / (w.n(r, j) * w.L)

            hs.append(_Hyp(
                "F11", f"no rank synchronised ({norm} normalisation)",
                lambda w, ell=ell: [sum(ell(w, r, j) for j in range(w.L)) for r in range(w.W)],
                per_rank=True, scale_fit=True))
            hs.append(_Hyp(
                "F11", f"only the first micro-step synchronised ({norm} normalisation)",
                lambda w, ell=ell: [
                    sum(ell(w, q, 0) for q in range(w.W)) / w.W
                    + sum((ell(w, r, j) for j in range(1, w.L)), torch.zeros(()))
                    for r in range(w.W)],
                per_rank=True, scale_fit=True))
    if setup.make_scheduler is not None and K > 1:
        hs.append(_Hyp("F4", "scheduler stepped after every micro-step's backward",
                       lambda w: [w.correct()], sched_per_step=lambda n: 1,
                       sched_before=lambda n: n - 1))
        hs.append(_Hyp("F4", "scheduler stepped K times after each optimizer step",
                       lambda w: [w.correct()], sched_per_step=lambda n: n))
    if setup.max_grad_norm is not None and K > 1:
        mx = setup.max_grad_norm

        def clip_each(w: _Win) -> list[torch.Tensor]:
            accs = []
            for r in range(w.W):
                acc = torch.zeros(())
                for j in range(w.L - 1):
                    acc = _clip(acc + w.g(r, j) * w.W / w.N, mx)
                accs.append(acc + w.g(r, w.L - 1) * w.W / w.N)
            return [sum(accs) / w.W]

        hs.append(_Hyp("F8", "accumulated gradient clipped after every backward", clip_each))
    if setup.max_grad_norm is None or setup.max_grad_norm > 1.0:
        hs.append(_Hyp("F9", "clipped at global norm 1.0", lambda w: [w.correct()], clip=1.0))
    if low_precision is not None:
        lp = low_precision

        def low(w: _Win) -> list[torch.Tensor]:
            accs = []
            for r in range(w.W):
                acc = torch.zeros((), dtype=lp)
                for j in range(w.L):
                    acc = (acc + (w.g(r, j) * w.W / w.N).to(lp)).to(lp)
                accs.append(acc.double())
            return [sum(accs) / w.W]

        hs.append(_Hyp("F12", f"gradients accumulated in {str(lp).replace('torch.', '')}", low))
    for d in (-1, 1):
        if K + d >= 1:
            hs.append(_Hyp("F13", f"windows of K{d:+d} = {K + d} micro-steps",
                           lambda w: [w.correct()],
                           windows=lambda m, k, d=d: _chunks(m, k + d)))
    return hs


def _scale_label(s: float, k: int, w: int) -> str:
    named = {"1": 1.0, "1/K": 1.0 / k, "K": float(k), "1/W": 1.0 / w, "W": float(w),
             "1/(K·W)": 1.0 / (k * w), "K·W": float(k * w)}
    for label, v in named.items():
        if abs(s - v) <= 0.02 * abs(v):
            return label if label == "1" else f"{label} = {v:.4g}"
    return f"{s:.4g}"


# ----------------------------------------------------------------------------- entry point
class DiagnosisCache:
    """Simulations shared by several diagnoses of the *same* setup and batches (one
    :func:`accumguard.verify.audit.audit_many` call): the predicted trajectories do not depend on
    the observed loop, so the second broken loop of a call re-simulates only its fitted
    scales. A cache used with another setup, other batches or another dtype is rebuilt."""

    def __init__(self) -> None:
        self._key: tuple[int, int, torch.dtype] | None = None
        self._sim: _Sim | None = None

    def sim(self, setup: AuditSetup, all_batches: list[list[Any]], dtype: torch.dtype) -> _Sim:
        key = (id(setup), id(all_batches), dtype)
        if self._sim is None or key != self._key:
            self._sim, self._key = _Sim(setup, all_batches, dtype), key
        return self._sim

    @property
    def grad_evaluations(self) -> int:
        """Per-micro-batch backward passes run so far (what the cache saves)."""
        return 0 if self._sim is None else self._sim.grad_evaluations


def diagnose(setup: AuditSetup, all_batches: list[list[Any]], observations: list[dict[str, Any]],
             report: Any, *, dtype: torch.dtype = torch.float64,
             cache: DiagnosisCache | None = None) -> Diagnosis:
    """Fit every failure hypothesis to the observed run; return the best explanation.

    ``observations`` are the per-rank observer results of :func:`accumguard.verify.audit.audit`
    (rank 0's trajectory is fitted); ``report`` is its :class:`~accumguard.verify.audit.AuditReport`
    (for counts, engine and tolerance). ``cache`` shares the simulations between
    diagnoses of one setup and one ``all_batches`` object (the audit passes one per call).
    """

    with _single_thread():
        sim = (cache or DiagnosisCache()).sim(setup, all_batches, dtype)
        return _diagnose(sim, setup, observations, report)


def _diagnose(sim: _Sim, setup: AuditSetup, observations: list[dict[str, Any]],
              report: Any) -> Diagnosis:
    obs = observations[0]
    observed = [p for p in obs["params"]]
    lp = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(report.param_dtype)
    initial = {n: t.double() for n, t in obs["initial"].items()}
    g0 = obs["grads"][0] if obs["grads"] and obs["grads"][0] is not None else None
    g0_flat = None
    if g0 is not None and all(n in g0 for n in sim.names):
        g0_flat = torch.cat([g0[n].reshape(-1) for n in sim.names])
    K, W = sim.K, sim.W

    # Low-precision weights re-round every update by u·|θ|, which swamps the differences
    # between hypotheses in the update; there the observed first gradient decides.
    by_grad = lp is not None and g0_flat is not None

    def distance(traj: list[dict[str, torch.Tensor]], first: torch.Tensor,
                 ref: list[Any], ref_first: torch.Tensor) -> float:
        """How far ``traj`` is from ``ref`` (relative to ``ref``'s updates)."""
        if len(traj) != len(ref) or any(p is None for p in ref):
            return math.inf
        if by_grad:
            den = float(ref_first.norm())
            return float((ref_first - first).norm()) / den if den else math.inf
        return max((relative_update_error(initial, o, t) for o, t in zip(ref, traj,
                                                                        strict=True)),
                   default=math.inf)

    def residual(traj: list[dict[str, torch.Tensor]], first: torch.Tensor) -> float:
        if by_grad:
            assert g0_flat is not None
            if len(traj) != len(observed) or any(p is None for p in observed):
                return math.inf
            den = float(first.norm())
            return float((g0_flat - first).norm()) / den if den else math.inf
        return distance(traj, first, observed, first)

    tol = float(report.tolerance)
    hyps = _hypotheses(setup, sim, lp)
    assert hyps[0].id == "OK"
    # (When the correct update takes another number of steps than the loop, every
    # hypothesis that fits the step count is infinitely far from it: no run needed.)
    ok_run = (sim.run(hyps[0], 1.0) if len(_chunks(sim.M, K)) == len(observed) else None)
    # How far each candidate's prediction is from the correct update's prediction.
    from_ok: dict[int, float] = {}
    cands: list[Candidate] = []
    for h in hyps:
        best: Candidate | None = None
        if len((h.windows or _chunks)(sim.M, K)) != len(observed):
            # A different number of optimizer steps cannot explain the run: skip simulating.
            cands.append(Candidate(h.id, h.variant, math.inf))
            continue
        scales = list(h.fixed_scales)
        traj, first = sim.run(h, scales[0])
        tried = {scales[0]: residual(traj, first)}
        runs = {scales[0]: (traj, first)}
        if h.scale_fit:
            if g0_flat is not None and float(first.norm()) > 0:
                first = first / scales[0]
                s = float(g0_flat @ first / (first @ first))
                if s > 0 and abs(s - 1) > 1e-6:
                    scales.append(s)
            else:
                scales += [1.0 / K, float(K), 1.0 / W, float(W)]
        for s in scales:
            if s not in tried:
                runs[s] = sim.run(h, s)
                tried[s] = residual(*runs[s])
        for s, res in tried.items():
            c = Candidate(h.id, h.variant, res, s, _scale_label(s, K, W))
            if best is None or res < best.residual:
                best = c
        assert best is not None
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
    threshold = (max(1e-3, 2 * float(report.tolerance)) if by_grad
                 else max(1e-3, 10 * float(report.tolerance)))
    evidence = _evidence(report, obs, sim)
    top = cands[0]
    bug_id = _refine(top.id, report, evidence)
    runner = next((c for c in cands[1:] if c.id != top.id), None)
    explained = math.isfinite(top.residual) and top.residual <= threshold
    if not explained:
        return Diagnosis(explained=False, bug_id="unexplained", title="no known class fits",
                         variant="", residual=top.residual, scale=1.0, scale_label="1",
                         fix="Compare the per-step counts and the first diverging parameter "
                             "with the reference; the loop does something none of F1-F13 "
                             "describe.",
                         threshold=threshold, runner_up=runner, closest=top, candidates=cands,
                         evidence=evidence)
    return Diagnosis(explained=True, bug_id=bug_id, title=TITLES.get(bug_id, bug_id),
                     variant=top.variant, residual=top.residual, scale=top.scale,
                     scale_label=top.scale_label, fix=FIXES.get(bug_id, ""),
                     threshold=threshold, runner_up=runner, closest=None, candidates=cands,
                     evidence=evidence)


def _evidence(report: Any, obs: dict[str, Any], sim: _Sim) -> list[str]:
    ev = []
    steps = report.optimizer_steps
    if steps and steps != report.reference_steps:
        ev.append(f"{steps} optimizer steps for {sim.M} micro-batches per rank "
                  f"(reference: {report.reference_steps})")
    zin = report.totals.zero_grad_in_window
    if zin:
        ev.append(f"{zin} zero_grad call(s) between backwards of one window")
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
    info = report.engine_info or {}
    if report.engine == "deepspeed":
        ev.append(f"DeepSpeed ZeRO-{info.get('zero_stage', '?')}, config "
                  f"gradient_accumulation_steps={info.get('gradient_accumulation_steps', '?')}, "
                  f"gradient_clipping={info.get('gradient_clipping', '?')}")
    return ev


def _refine(bug_id: str, report: Any, evidence: list[str]) -> str:
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
