"""The failure hypotheses of the diagnosis, and the fp64 simulator that plays them.

Each hypothesis is a small single-process program on the same initial weights, the
same per-rank micro-batches, optimizer, scheduler and clipping as the audited
loop: it predicts the parameters after every optimizer step. Most are
*stateless*: a list of steps (which micro-batches, normalised by which window's
count) and a formula for the gradient each step receives (``combine``). Bugs that
carry gradient from one step into the next (a step on every partial sum, a
micro-batch held back by an inverted sync flag) are written as ``program``\\ s that
drive the replicas themselves.

Indices: ``M`` micro-batches per rank per epoch, ``E`` epochs (the same
micro-batches every epoch), ``K`` the accumulation steps, ``W`` ranks.

Size (~510 lines): one simulation per failure class, kept side by side so that a new class is added next to the ones it must be told apart from.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from accumguard.verify.contract import AuditSetup
from accumguard.verify.reference import canonical_name, cast_floats, move_to

__all__ = ["Sim", "Hyp", "hypotheses", "chunks", "clip"]

Replica = tuple[torch.nn.Module, Any, Any]
Traj = list[dict[str, torch.Tensor]]
# One optimizer step: the micro-batch indices whose gradients it sums, and the indices whose
# counts normalise them (the loop's window; the same list unless a window was merged).
Step = tuple[list[int], list[int]]


def chunks(m: int, k: int) -> list[list[int]]:
    return [list(range(s, min(s + k, m))) for s in range(0, m, k)]


def _steps(windows: Sequence[list[int]]) -> list[Step]:
    return [(w, w) for w in windows]


def _tsum(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """The builtin ``sum`` of gradient terms (``0 + t0 + t1 + ...``), typed as a tensor: every
    sum here runs over ranks or a window's micro-batches, never over nothing."""
    total = sum(terms)
    assert isinstance(total, torch.Tensor)
    return total


def clip(v: torch.Tensor, max_norm: float | None) -> torch.Tensor:
    if max_norm is None:
        return v
    norm = float(v.norm())
    # Same factor as torch.nn.utils.clip_grad_norm_.
    coef = max_norm / (norm + 1e-6)
    return v * coef if coef < 1 else v


def _digest(model: torch.nn.Module) -> bytes:
    """Fingerprint of a replica's weights (and buffers): equal fingerprints, equal gradients
    on the same micro-batch (the simulation is deterministic, single-threaded)."""
    h = hashlib.blake2b(digest_size=16)
    for t in list(model.parameters()) + list(model.buffers()):
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.digest()


class Win:
    """What a stateless hypothesis's gradient formula may use for one optimizer step."""

    def __init__(self, sim: Sim, step: Step, replicas: list[Replica]) -> None:
        self.sim = sim
        self.idx, self.norm_idx = step
        self.L = len(self.idx)
        self.W = sim.W
        self.K = sim.K
        self._replicas = replicas

    def g(self, r: int, j: int) -> torch.Tensor:
        """Flat gradient of the *summed* loss of micro-batch ``idx[j]`` of rank ``r``, at
        rank r's replica (replica 0 when the hypothesis keeps ranks identical)."""
        rep = self._replicas[r if len(self._replicas) > 1 else 0]
        return self.sim.g(rep, r, self.idx[j])

    def n(self, r: int, j: int) -> float:
        return self.sim.counts[r][self.idx[j]]

    @property
    def N(self) -> float:
        """The count of the loop's window over all ranks (what a correct loop divides by)."""
        return sum(self.sim.counts[r][i] for r in range(self.W) for i in self.norm_idx)

    def Nr(self, r: int) -> float:
        return sum(self.sim.counts[r][i] for i in self.norm_idx)

    def correct(self) -> torch.Tensor:
        return _tsum(self.g(r, j) for r in range(self.W) for j in range(self.L)) / self.N


Combine = Callable[[Win], list[torch.Tensor]]
# A per-micro-batch gradient term (window, rank, index in the window) of the F11 hypotheses.
Ell = Callable[[Win, int, int], torch.Tensor]
Program = Callable[["Sim", float], tuple[Traj, torch.Tensor]]


@dataclass(frozen=True)
class Hyp:
    """One hypothesis. Stateless ones give ``combine`` (+ ``steps``); stateful ones a
    ``program`` and ``count`` (how many optimizer steps it predicts)."""

    id: str
    variant: str
    combine: Combine | None = None
    steps: Callable[[int, int, int], list[Step]] | None = None
    per_rank: bool = False
    sched_per_step: Callable[[int], int] | None = None
    sched_before: Callable[[int], int] | None = None
    # (before, after) scheduler steps around optimizer step number s, when the count follows
    # what was observed per step rather than the window's length.
    sched_at: Callable[[int], tuple[int, int]] | None = None
    # Scale only the steps on a partial window (fewer than K micro-batches); the diagnosis
    # searches that scale on the trajectory (the first gradient is a full window's).
    partial_scale: bool = False
    clip: float | None | Literal["setup"] = "setup"
    scale_fit: bool = False
    fixed_scales: tuple[float, ...] = (1.0,)
    program: Program | None = None
    count: Callable[[int, int, int], int] | None = None

    def n_steps(self, m: int, k: int, e: int) -> int:
        if self.count is not None:
            return self.count(m, k, e)
        return len((self.steps or default_steps)(m, k, e))


def default_steps(m: int, k: int, e: int) -> list[Step]:
    return _steps(chunks(m, k) * e)


class Sim:
    """Plays hypotheses in ``dtype`` (fp64) and memoises what does not depend on the loop."""

    def __init__(self, setup: AuditSetup, batches: list[list[Any]], dtype: torch.dtype) -> None:
        self.setup = setup
        self.dtype = dtype
        # The diagnosis replays on the CPU like the reference, whatever device the loop used.
        self.batches = [[cast_floats(move_to(b, "cpu"), dtype) for b in rank]
                        for rank in batches]
        self.W = len(batches)
        self.M = len(batches[0])
        self.K = setup.accumulation_steps
        self.E = setup.epochs
        self.base = setup.build_model().to("cpu", dtype)
        self.names = [canonical_name(n) for n, _ in self.base.named_parameters()]
        self.counts = [[self._count(b) for b in rank] for rank in self.batches]
        # Per-micro-batch gradients g(r, i) are what every hypothesis spends its time on, and
        # all hypotheses start from the same weights; those at the initial weights and along
        # the correct trajectory (which inactive or scale-1 hypotheses retrace) are kept, keyed
        # on the weights' fingerprint: at most 2·W·M·E gradients.
        self._keep: set[bytes] = {_digest(self.base)}
        self._grads: dict[tuple[bytes, int, int], torch.Tensor] = {}
        self._remember = False
        # Whole predicted trajectories, per (hypothesis, variant, scale): they do not depend
        # on the observation, so several diagnoses of one audit_many call share them.
        self.runs: dict[tuple[str, str, float], tuple[Traj, torch.Tensor]] = {}
        self.grad_evaluations = 0

    def _count(self, batch: Any) -> float:
        if self.setup.count_fn is not None:
            return float(torch.as_tensor(self.setup.count_fn(batch)).sum())
        with torch.no_grad():
            return float(torch.as_tensor(self.setup.loss_fn(self.base, batch)[1]).sum())

    def replica(self) -> Replica:
        model = copy.deepcopy(self.base)
        opt = self.setup.make_optimizer([p for p in model.parameters()])
        sched = self.setup.make_scheduler(opt) if self.setup.make_scheduler else None
        return model, opt, sched

    def g(self, rep: Replica, r: int, i: int) -> torch.Tensor:
        """Gradient of rank r's micro-batch i's summed loss at ``rep``'s weights (cached by
        the weights' fingerprint at the initial weights and along the correct trajectory)."""
        digest = _digest(rep[0])
        if self._remember:
            self._keep.add(digest)
        hit = self._grads.get((digest, r, i))
        if hit is not None:
            return hit
        self.grad_evaluations += 1
        model = rep[0]
        for p in model.parameters():
            p.grad = None
        s, _ = self.setup.loss_fn(model, self.batches[r][i])
        s.backward()  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                       for p in model.parameters()]).detach().clone()
        if digest in self._keep:
            self._grads[(digest, r, i)] = g
        return g

    def apply(self, rep: Replica, vec: torch.Tensor, sched_steps: int = 1,
              sched_before: int = 0) -> None:
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

    def params(self, rep: Replica) -> dict[str, torch.Tensor]:
        return {n: p.detach().double().clone() for n, p in zip(self.names, rep[0].parameters(),
                                                             strict=True)}

    def clip_of(self, h: Hyp) -> float | None:
        return self.setup.max_grad_norm if h.clip == "setup" else h.clip

    def run(self, h: Hyp, scale: float) -> tuple[Traj, torch.Tensor]:
        """Predicted trajectory (parameters after each step) and first clipped gradient;
        memoised per (class, variant, scale). The results are shared: do not modify them."""
        key = (h.id, h.variant, float(scale))
        if key not in self.runs:
            # The correct update at scale 1 is the trajectory others most often retrace.
            self._remember = h.id == "OK" and scale == 1.0
            try:
                self.runs[key] = (h.program(self, scale) if h.program is not None
                                  else self._run(h, scale))
            finally:
                self._remember = False
        return self.runs[key]

    def _run(self, h: Hyp, scale: float) -> tuple[Traj, torch.Tensor]:
        assert h.combine is not None
        reps = [self.replica() for _ in range(self.W if h.per_rank else 1)]
        traj: Traj = []
        first: torch.Tensor | None = None
        mx = self.clip_of(h)
        for s, step in enumerate((h.steps or default_steps)(self.M, self.K, self.E)):
            vecs = h.combine(Win(self, step, reps))
            sc = scale if not h.partial_scale or len(step[0]) < self.K else 1.0
            if first is None:
                first = clip(vecs[0] * sc, mx)
            after = h.sched_per_step(len(step[0])) if h.sched_per_step else 1
            before = h.sched_before(len(step[0])) if h.sched_before else 0
            if h.sched_at is not None:
                before, after = h.sched_at(s)
            for rep, v in zip(reps, vecs, strict=True):
                self.apply(rep, clip(v * sc, mx), after, before)
            traj.append(self.params(reps[0]))
        if first is None:
            first = torch.zeros(sum(p.numel() for p in self.base.parameters()),
                                dtype=self.dtype)
        return traj, first


# ----------------------------------------------------------------------------- stateful bugs
def _norm(sim: Sim, r: int, i: int, window: list[int], how: str) -> float:
    """Factor a loop applies to micro-batch i's summed loss: ``global`` = W/N (the correct
    normaliser, the engine then averages over ranks), ``mean`` = 1/(n_i·K)."""
    if how == "global":
        return sim.W / sum(sim.counts[q][j] for q in range(sim.W) for j in window)
    return 1.0 / (sim.counts[r][i] * sim.K)


def _step_every_partial_sum(synced: bool, how: str) -> Program:
    """F1b: optimizer.step() after every backward, zero_grad only at the boundary: each step
    applies the running partial sum. ``synced``: DDP reduces every backward (the average of
    the ranks' partial sums); else (no_sync) ranks step on local sums until the boundary."""

    def program(sim: Sim, scale: float) -> tuple[Traj, torch.Tensor]:
        reps = [sim.replica() for _ in range(1 if synced else sim.W)]
        mx = sim.setup.max_grad_norm
        traj: Traj = []
        first: torch.Tensor | None = None
        for window in chunks(sim.M, sim.K) * sim.E:
            acc: list[torch.Tensor | None] = [None] * sim.W
            for j, i in enumerate(window):
                for r in range(sim.W):
                    rep = reps[0 if synced else r]
                    g = sim.g(rep, r, i) * _norm(sim, r, i, window, how)
                    prev = acc[r]
                    acc[r] = g if prev is None else prev + g
                last = j == len(window) - 1
                if synced or last:
                    mean = _tsum(a for a in acc if a is not None) / sim.W
                    acc = [mean] * sim.W
                vecs = [acc[0]] if synced else acc
                for rep, v in zip(reps, vecs, strict=True):
                    assert v is not None
                    sim.apply(rep, clip(v * scale, mx), 1 if last else 0)
                if first is None:
                    assert acc[0] is not None  # vecs[0] is acc[0], checked above
                    first = clip(acc[0] * scale, mx)
                traj.append(sim.params(reps[0]))
        assert first is not None
        return traj, first

    return program


def _late_last_micro(how: str) -> Program:
    """F11, FSDP2-style inverted sync flag: the first L-1 micro-steps reduce, the last does
    not; its gradient stays in the unsharded accumulation and reaches the optimizer with the
    next window's first reduction, one step late. A window with no reducing micro-step gives
    the optimizer no gradient: that step() is a no-op and not counted."""

    def program(sim: Sim, scale: float) -> tuple[Traj, torch.Tensor]:
        rep = sim.replica()
        mx = sim.setup.max_grad_norm
        traj: Traj = []
        first: torch.Tensor | None = None
        carry: list[torch.Tensor | None] = [None] * sim.W
        for window in chunks(sim.M, sim.K) * sim.E:
            reduced: torch.Tensor | None = None
            for j, i in enumerate(window):
                for r in range(sim.W):
                    g = sim.g(rep, r, i) * _norm(sim, r, i, window, how)
                    prev = carry[r]
                    carry[r] = g if prev is None else prev + g
                if j < len(window) - 1:
                    mean = _tsum(c for c in carry if c is not None) / sim.W
                    reduced = mean if reduced is None else reduced + mean
                    carry = [None] * sim.W
            if reduced is None:
                continue
            if first is None:
                first = clip(reduced * scale, mx)
            sim.apply(rep, clip(reduced * scale, mx))
            traj.append(sim.params(rep))
        if first is None:
            first = torch.zeros(sum(p.numel() for p in sim.base.parameters()), dtype=sim.dtype)
        return traj, first

    return program


def _late_count(m: int, k: int, e: int) -> int:
    return sum(1 for w in chunks(m, k) * e if len(w) > 1)


# ----------------------------------------------------------------------------- step lists
def _every_micro(m: int, k: int, e: int) -> list[Step]:
    return [([i], w) for w in chunks(m, k) * e for i in w]


def _every_micro_own(m: int, k: int, e: int) -> list[Step]:
    return _steps([[i] for i in range(m)] * e)


def _double_gated(m: int, k: int, e: int) -> list[Step]:
    """F14: the engine counts one micro-step per step() call (one per window) and steps the
    optimizer on every K-th call; the counter runs on across epochs."""
    return _steps([w for n, w in enumerate(chunks(m, k) * e) if (n + 1) % k == 0])


def _dropped(m: int, k: int, e: int) -> list[Step]:
    return _steps(chunks(m - m % k, k) * e)


def _leaked(merge_norm: bool) -> Callable[[int, int, int], list[Step]]:
    """F7 across epochs: the final partial window is not stepped and its gradient is not
    cleared, so it is added to the next epoch's first window (the last epoch's leftover is
    never applied). Normalised per micro-batch by the loop's K-window, or by the merged
    window's count (``merge_norm``)."""

    def steps(m: int, k: int, e: int) -> list[Step]:
        full, rest = chunks(m - m % k, k), list(range(m - m % k, m))
        out: list[Step] = []
        carry: list[int] = []
        for _ in range(e):
            for n, w in enumerate(full):
                idx = (carry + w) if n == 0 else w
                out.append((idx, idx if merge_norm else w))
            carry = rest
        return out

    return steps


def _straddle(m: int, k: int, e: int) -> list[Step]:
    """Counter never reset at the epoch end: windows of K run across the epoch boundary."""
    stream = list(range(m)) * e
    return _steps([stream[s:s + k] for s in range(0, len(stream), k)])


# ----------------------------------------------------------------------------- the list
def _rank_mean(w: Win, f: Callable[[int], torch.Tensor]) -> torch.Tensor:
    return _tsum(f(r) for r in range(w.W)) / w.W


def hypotheses(setup: AuditSetup, sim: Sim, low_precision: torch.dtype | None, *,
               sched_counts: Sequence[int] | None = None,
               clip_seen: float | None = None) -> list[Hyp]:
    """Every hypothesis that can apply to this setup and data ("OK" first).

    ``sched_counts``: the scheduler steps observed per optimizer step (F4 then follows
    them, whatever the windows' lengths); ``clip_seen``: the norm of the first observed
    gradient, the threshold a loop that clips by hand without telling the setup would
    leave there (F8 when the setup has no ``max_grad_norm``)."""
    K, W, M, E = sim.K, sim.W, sim.M, sim.E

    def last(w: Win) -> int:
        return w.L - 1

    hs = [
        Hyp("OK", "sum over the window / global count", lambda w: [w.correct()]),
        Hyp("F1", "each micro-step's rank-mean loss",
            lambda w: [_rank_mean(w, lambda r: w.g(r, 0) / w.n(r, 0))],
            steps=_every_micro_own, scale_fit=True),
        Hyp("F1", "each micro-step's global token mean", lambda w: [w.correct()],
            steps=_every_micro_own, scale_fit=True),
        Hyp("F1", "each micro-step, normalised by its window's count", lambda w: [w.correct()],
            steps=_every_micro, scale_fit=True),
        Hyp("F2/F3", "last micro-batch, its rank-mean loss",
            lambda w: [_rank_mean(w, lambda r: w.g(r, last(w)) / w.n(r, last(w)))],
            scale_fit=True),
        Hyp("F2/F3", "last micro-batch, divided by the window's count",
            lambda w: [_tsum(w.g(r, last(w)) for r in range(w.W)) / w.N], scale_fit=True),
        Hyp("F2/F3", "last micro-batch, divided by its own count over ranks",
            lambda w: [_tsum(w.g(r, last(w)) for r in range(w.W))
                       / sum(w.n(r, last(w)) for r in range(w.W))], scale_fit=True),
        Hyp("F10", "×W / ÷W", lambda w: [w.correct()], fixed_scales=(float(W), 1.0 / W)),
    ]
    if K > 1:
        for synced in (True, False):
            for how in ("global", "mean"):
                hs.append(Hyp(
                    "F1b", f"step on every partial sum ({'synced every micro-step' if synced else 'no_sync until the boundary'}, {how} normalisation)",  # noqa: E501
                    program=_step_every_partial_sum(synced, how), count=lambda m, k, e: m * e,
                    scale_fit=True))
        hs.append(Hyp("F14", "every K-th window, last micro-batch, ÷ window count",
                      lambda w: [_tsum(w.g(r, last(w)) for r in range(w.W)) / w.N],
                      steps=_double_gated, scale_fit=True))
        hs.append(Hyp("F14", "every K-th window, last micro-batch, its rank-mean loss",
                      lambda w: [_rank_mean(w, lambda r: w.g(r, last(w)) / w.n(r, last(w)))],
                      steps=_double_gated, scale_fit=True))
    # With equal counts everywhere a mean of means is exact: F5 is no bug there (and on a
    # partial window it would predict exactly what F7 predicts).
    uneven = len({c for rank in sim.counts for c in rank}) > 1
    if uneven:
        hs.append(Hyp("F5", "Σ_i (g_i/n_i)/K, averaged over ranks",
                      lambda w: [_rank_mean(w, lambda r: _tsum(w.g(r, j) / w.n(r, j)
                                                             for j in range(w.L)) / w.K)]))
    if M % K and uneven:
        hs.append(Hyp("F5", "Σ_i (g_i/n_i)/len(window), averaged over ranks",
                      lambda w: [_rank_mean(w, lambda r: _tsum(w.g(r, j) / w.n(r, j)
                                                             for j in range(w.L)) / w.L)]))
    if M % K:
        hs.append(Hyp("F7", "partial window divided by K",
                      lambda w: [w.correct() * (w.L / w.K)]))
        hs.append(Hyp("F7", "partial window scaled by a constant, full windows exact",
                      lambda w: [w.correct()], partial_scale=True))
        hs.append(Hyp("F7", "partial window dropped", lambda w: [w.correct()], steps=_dropped))
        if E > 1:
            for merge in (False, True):
                hs.append(Hyp("F7", "partial window leaked into the next epoch's first window"
                              + (" (÷ merged count)" if merge else ""),
                              lambda w: [w.correct()], steps=_leaked(merge), scale_fit=True))
            hs.append(Hyp("F13", "counter not reset at the epoch end: windows straddle epochs",
                          lambda w: [w.correct()], steps=_straddle))
    if W > 1:
        hs.append(Hyp("F6", "rank-local sum / rank-local count, averaged over ranks",
                      lambda w: [_rank_mean(w, lambda r: _tsum(w.g(r, j) for j in range(w.L))
                                            / w.Nr(r))]))
        for norm in ("global", "mean"):
            def ell(w: Win, r: int, j: int, norm: str = norm) -> torch.Tensor:
                if norm == "global":
                    return w.g(r, j) * w.W / w.N
                return w.g(r, j) / (w.n(r, j) * w.L)

            def unsynced(w: Win, ell: Ell = ell) -> list[torch.Tensor]:
                return [_tsum(ell(w, r, j) for j in range(w.L)) for r in range(w.W)]

            def first_synced(w: Win, ell: Ell = ell) -> list[torch.Tensor]:
                return [_tsum(ell(w, q, 0) for q in range(w.W)) / w.W
                        + sum((ell(w, r, j) for j in range(1, w.L)), torch.zeros(()))
                        for r in range(w.W)]

            def last_local(w: Win, ell: Ell = ell) -> list[torch.Tensor]:
                return [sum((ell(w, q, j) for q in range(w.W) for j in range(w.L - 1)),
                            torch.zeros(())) / w.W + ell(w, r, w.L - 1)
                        for r in range(w.W)]

            hs.append(Hyp(
                "F11", f"no rank synchronised ({norm} normalisation)",
                unsynced, per_rank=True, scale_fit=True))
            hs.append(Hyp(
                "F11", f"only the first micro-step synchronised ({norm} normalisation)",
                first_synced, per_rank=True, scale_fit=True))
            hs.append(Hyp(
                "F11", f"sync flag inverted, DDP: the last micro-step stays local ({norm} "
                "normalisation)",
                last_local, per_rank=True, scale_fit=True))
        if K > 1:
            hs.append(Hyp("F11", "sync flag inverted, FSDP2: the last micro-batch reaches the "
                          "optimizer one step late, with the next window's",
                          program=_late_last_micro("global"), count=_late_count,
                          scale_fit=True))
    if setup.make_scheduler is not None and K > 1:
        hs.append(Hyp("F4", "scheduler stepped after every micro-step's backward",
                      lambda w: [w.correct()], sched_per_step=lambda n: 1,
                      sched_before=lambda n: n - 1))
        hs.append(Hyp("F4", "scheduler stepped after every backward, all before the "
                      "optimizer step (len(window) times per step)",
                      lambda w: [w.correct()], sched_per_step=lambda n: 0,
                      sched_before=lambda n: n))
        hs.append(Hyp("F4", "scheduler stepped K times after each optimizer step",
                      lambda w: [w.correct()], sched_per_step=lambda n: n))
    if (setup.make_scheduler is not None and sched_counts
            and any(c != 1 for c in sched_counts)):
        seen = list(sched_counts)

        def at(s: int, before: bool) -> tuple[int, int]:
            c = seen[s] if s < len(seen) else 1
            return (c, 0) if before else (0, c)

        for before in (True, False):
            hs.append(Hyp("F4", "scheduler stepped as often as observed per optimizer step ("
                          + ("before" if before else "after") + " it)",
                          lambda w: [w.correct()],
                          sched_at=functools.partial(at, before=before)))
    if setup.make_scheduler is not None and W > 1 and W != K:
        hs.append(Hyp("F4", "scheduler stepped once per process (W times) per optimizer step",
                      lambda w: [w.correct()], sched_per_step=lambda n: W))
    mx_loop = setup.max_grad_norm if setup.max_grad_norm is not None else clip_seen
    if mx_loop is not None and mx_loop > 0 and K > 1:
        c = mx_loop

        def clip_running(w: Win) -> list[torch.Tensor]:
            # clip_grad_norm_ after every backward of a synchronised loop (DDP reducing each
            # backward): the running sum of the window's gradient is clipped, then the next
            # micro-batch's gradient is added to the clipped sum.
            acc = torch.zeros(())
            for j in range(w.L):
                acc = clip(acc + _tsum(w.g(r, j) for r in range(w.W)) / w.N, c)
            return [acc]

        hs.append(Hyp("F8", f"running sum clipped after every backward (at {c:.3g})",
                      clip_running))
    if setup.max_grad_norm is not None and K > 1:
        mx = setup.max_grad_norm

        def clip_each(w: Win) -> list[torch.Tensor]:
            accs = []
            for r in range(w.W):
                acc = torch.zeros(())
                for j in range(w.L - 1):
                    acc = clip(acc + w.g(r, j) * w.W / w.N, mx)
                accs.append(acc + w.g(r, w.L - 1) * w.W / w.N)
            return [_tsum(accs) / w.W]

        hs.append(Hyp("F8", "accumulated gradient clipped after every backward", clip_each))
    if setup.max_grad_norm is None or setup.max_grad_norm > 1.0:
        hs.append(Hyp("F9", "clipped at global norm 1.0", lambda w: [w.correct()], clip=1.0))
    for lp in ([low_precision] if low_precision is not None
               else [torch.bfloat16, torch.float16]):
        def low(w: Win, lp: torch.dtype = lp) -> list[torch.Tensor]:
            accs = []
            for r in range(w.W):
                acc = torch.zeros((), dtype=lp)
                for j in range(w.L):
                    acc = (acc + (w.g(r, j) * w.W / w.N).to(lp)).to(lp)
                accs.append(acc.double())
            return [_tsum(accs) / w.W]

        hs.append(Hyp("F12", f"gradients accumulated in {str(lp).replace('torch.', '')}", low))
    for d in (-1, 1):
        if K + d >= 1:
            def shifted(m: int, k: int, e: int, d: int = d) -> list[Step]:
                return _steps(chunks(m, k + d) * e)

            hs.append(Hyp("F13", f"windows of K{d:+d} = {K + d} micro-steps",
                          lambda w: [w.correct()], steps=shifted))
    return hs
