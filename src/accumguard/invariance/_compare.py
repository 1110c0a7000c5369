"""``accumguard invariance``: comparing one run with the reference run step by step (the
tolerance is :mod:`._tolerance`'s). Steps are numbered from 1."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from accumguard.invariance._records import RunRecord
from accumguard.invariance._tolerance import (
    FP32_TOLERANCE,
    InvarianceTolerance,
    invariance_tolerance,
)

__all__ = ["StepComparison", "KComparison", "compare_runs", "invariance_tolerance",
           "FP32_TOLERANCE"]

@dataclass
class StepComparison:
    """One optimizer step of run K against the reference run."""

    step: int  # 1-based: the first optimizer step is step 1
    loss_ref: float | None
    loss: float | None
    loss_rel_diff: float | None
    update_rel_diff: float | None  # None: not recorded for this step
    update_norm_ref: float | None
    backwards_ref: list[int]
    backwards: list[int]
    diverged: bool = False  # beyond the tolerance (see KComparison.construction)
    decided_by: str = ""  # "update", "loss" or ""
    tolerance: float | None = None  # the bound at this step

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_float(v) for k, v in self.__dict__.items()}


@dataclass
class KComparison:
    """Run K against the reference K, step by step."""

    k: int
    k_ref: int
    steps: list[StepComparison]
    first_divergent_step: int | None
    max_update_rel_diff: float | None
    max_loss_rel_diff: float | None
    notes: list[str] = field(default_factory=list)
    #: what makes the script not K-invariant by construction (BatchNorm in train mode,
    #: in-batch negatives), seen in either run: a difference is then expected, not a bug
    construction: list[str] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        """Beyond the tolerance with nothing in the script that explains it."""
        return self.first_divergent_step is not None and not self.construction

    @property
    def by_construction(self) -> bool:
        """Beyond the tolerance, in a script that is not K-invariant by construction."""
        return self.first_divergent_step is not None and bool(self.construction)

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "k_ref": self.k_ref, "diverged": self.diverged,
                "not_invariant_by_construction": self.by_construction,
                "construction": self.construction,
                "first_divergent_step": self.first_divergent_step,
                "max_update_rel_diff": _json_float(self.max_update_rel_diff),
                "max_loss_rel_diff": _json_float(self.max_loss_rel_diff),
                "notes": self.notes, "steps": [s.to_dict() for s in self.steps]}


def _json_float(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    den = abs(b)
    return abs(a - b) / den if den > 0 else math.inf


def _update_diff(ref: RunRecord, run: RunRecord, index: int) -> tuple[float | None, float | None,
                                                                      list[str]]:
    """``||Δθ_K − Δθ_ref|| / ||Δθ_ref||`` over every rank's recorded shard for one step."""
    import torch

    num = den = 0.0
    seen = False
    problems: list[str] = []
    for rank in range(min(len(ref.updates), len(run.updates))):
        a = ref.updates[rank].get(index)
        b = run.updates[rank].get(index)
        if a is None and b is None:
            continue
        seen = True
        a = a or {}
        b = b or {}
        for name in sorted(set(a) | set(b)):
            ta, tb = a.get(name), b.get(name)
            if ta is not None and tb is not None and ta.shape != tb.shape:
                problems.append(f"rank {rank}: parameter {name!r} has shape {tuple(tb.shape)} "
                                f"at K={run.k} but {tuple(ta.shape)} at K={ref.k}")
                continue
            if ta is None or tb is None:
                problems.append(f"rank {rank}: parameter {name!r} updated only at "
                                f"K={ref.k if tb is None else run.k}")
            like = ta if ta is not None else tb
            assert like is not None  # the name came from a or b
            za = ta.double() if ta is not None else torch.zeros_like(like, dtype=torch.float64)
            zb = tb.double() if tb is not None else torch.zeros_like(like, dtype=torch.float64)
            num += float(torch.sum((zb - za) ** 2))
            den += float(torch.sum(za ** 2))
    if not seen:
        return None, None, problems
    nref = math.sqrt(den)
    if num == 0.0:
        return 0.0, nref, problems
    return (math.sqrt(num) / nref if nref > 0 else math.inf), nref, problems


def compare_runs(ref: RunRecord, run: RunRecord, tolerance: float | InvarianceTolerance
                 ) -> KComparison:
    """Compare ``run`` with ``ref`` step by step; a step diverges when its update (or, when no
    update was recorded, its window loss) differs by more than ``tolerance`` (a number, or
    the derived bound, which grows per step with low-precision weights)."""
    n = min(len(ref.steps), len(run.steps))
    notes: list[str] = []
    if len(ref.steps) != len(run.steps):
        notes.append(f"K={ref.k} recorded {len(ref.steps)} optimizer steps, K={run.k} "
                     f"{len(run.steps)}: comparing the first {n}")
    if ref.world_size != run.world_size:
        notes.append(f"K={ref.k} ran on {ref.world_size} rank(s), K={run.k} on "
                     f"{run.world_size}: the effective batch differs unless the script "
                     "compensates")
    if not (ref.has_updates and run.has_updates):
        notes.append("parameter updates were not recorded for "
                     + ("either run" if not (ref.has_updates or run.has_updates)
                        else f"K={run.k if ref.has_updates else ref.k}")
                     + ": the verdict rests on the window loss only")
    steps: list[StepComparison] = []
    first: int | None = None
    loss_only_steps: list[int] = []
    shown_problems = False
    for i in range(n):
        a, b = ref.steps[i], run.steps[i]
        loss_rel = (None if a.window_loss is None or b.window_loss is None
                    else _rel(b.window_loss, a.window_loss))
        upd, nref, problems = _update_diff(ref, run, a.index) if b.index == a.index else (
            None, None, [f"step index {b.index} at K={run.k} vs {a.index} at K={ref.k}"])
        if problems and not shown_problems:
            notes += problems[:3]
            shown_problems = True
        tol = (tolerance.at(i, ref.param_norms.get(a.index), nref)
               if isinstance(tolerance, InvarianceTolerance) else tolerance)
        sc = StepComparison(step=i + 1, loss_ref=a.window_loss, loss=b.window_loss,
                            loss_rel_diff=loss_rel, update_rel_diff=upd, update_norm_ref=nref,
                            backwards_ref=a.backwards, backwards=b.backwards, tolerance=tol)
        if upd is not None:
            sc.decided_by = "update"
            sc.diverged = not (upd <= tol)
            if not sc.diverged and loss_rel is not None and not (loss_rel <= tol):
                loss_only_steps.append(i + 1)
        elif loss_rel is not None:
            sc.decided_by = "loss"
            sc.diverged = not (loss_rel <= tol)
        if sc.diverged and first is None:
            first = i + 1
        steps.append(sc)
    if loss_only_steps:
        notes.append(f"the window loss as logged differs at step(s) {_ranges(loss_only_steps)} "
                     "but the parameter updates agree: the script reports its loss on a "
                     "different scale per K (e.g. the loss of the last micro-batch, or not "
                     "divided by K); the training itself is the same")
    if n == 0:
        notes.append("no optimizer step to compare")
    _backward_notes(ref, run, n, notes, diverged=first is not None)
    updates = [s.update_rel_diff for s in steps if s.update_rel_diff is not None]
    losses = [s.loss_rel_diff for s in steps if s.loss_rel_diff is not None]
    construction = list(dict.fromkeys([*ref.construction, *run.construction]))
    if construction:
        notes.append("not K-invariant by construction: " + "; ".join(construction)
                     + ". Differences between K are expected from the model itself, not from "
                     "the accumulation (the watch findings of this run judge the accumulation)")
    return KComparison(k=run.k, k_ref=ref.k, steps=steps, first_divergent_step=first,
                       max_update_rel_diff=max(updates) if updates else None,
                       max_loss_rel_diff=max(losses) if losses else None, notes=notes,
                       construction=construction)


def _ranges(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:6])) + (" ..." if len(steps) > 6 else "")


def _backward_notes(ref: RunRecord, run: RunRecord, n: int, notes: list[str], *,
                    diverged: bool) -> None:
    """Backward passes per step should scale with K (K per rank per step): say so if not,
    in words that agree with the verdict (these are backward counts, not the comparison)."""
    for who in (ref, run):
        odd = [(i + 1, s.backwards) for i, s in enumerate(who.steps[:n])
               if any(b != who.k for b in s.backwards)]
        if not odd:
            continue
        step, bw = odd[0]
        counts = sorted({b for _, c in odd for b in c})
        text = (f"K={who.k}: {', '.join(map(str, counts))} backward pass(es) per rank per "
                f"optimizer step at {len(odd)} of {n} steps (step {step}: {bw}), where one per "
                f"micro-batch makes {who.k}")
        if diverged:
            text += ("; the script may not take K from the placeholder, or steps on "
                     "micro-steps")
        else:
            other = run if who is ref else ref
            text += (f"; the updates agree with K={other.k} all the same: the script "
                     "accumulates another way (e.g. one backward of the summed micro-batch "
                     "losses) or may not take K from the placeholder, in which case the runs "
                     "did not exercise accumulation")
        notes.append(text)
