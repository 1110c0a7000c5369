"""The ledger's step (:class:`LedgerStep`: per rank and micro-step, one token's weight in the
update and the valid counts) and the two patterns of those weights that prove a
normalisation off without a total: each rank by its own count (F6, :func:`f6_findings`), and
each micro-step by its own count over the ranks (F5 across the ranks,
:func:`f5_across_findings`). Built and called by :mod:`._ledger`; pure Python, no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from accumguard.observe._records import Finding, _mk, _n
from accumguard.observe._weight_rules import WEIGHT_TOL, WEIGHT_TOL_LOW_PRECISION, _short, one

__all__ = ["ENGINES", "LedgerStep", "f5_across_findings", "f6_findings", "total_in_f6"]

ENGINES = {"ddp": "DDP", "fsdp2": "FSDP2", "deepspeed": "DeepSpeed"}


@dataclass(frozen=True)
class LedgerStep:
    """One step of the ledger: per rank its tokens' weights and counts, and the total."""

    step: int
    weights: dict[int, list[float]]  # per rank, per micro-step: one token's weight (w·f·c)
    counts: dict[int, list[float]]
    total: float  # E: every token's weight summed (1 for the large batch)
    factor: float | None  # f·c, None: the engine's reduction is unknown
    low: bool
    site: str
    engine: str
    optimizer: str
    clipped: bool
    # per rank and micro-step: the constants between the loss call and the root
    # (["/", c] or ["*", c], see :mod:`._losses`)
    divs: list[list[Any]]
    sole: bool  # every backward was the loss call times constants: the total is the loss's
    unit: str = "tokens"  # what the counts count (``_weight_rules.units``)
    scale: float | None = None  # c alone (the loop's scale after the reduction), when common
    units: list[list[Any]] | None = None  # FSDP2 units' factors when they disagree
    # elements per row when every loss call counts elements, d >= 2 of them per row
    per_row: int | None = None

    def per_row_one(self) -> bool:
        """The total over elements is the row count's 1 times the d elements of each row: a
        summed loss over elements normalised by the window's rows (a per-sample sum)."""
        return self.per_row is not None and self.near(self.total, float(self.per_row))

    @property
    def tol(self) -> float:
        return WEIGHT_TOL_LOW_PRECISION if self.low else WEIGHT_TOL

    def near(self, a: float, b: float) -> bool:
        return abs(a - b) <= self.tol * abs(b)

    def flat(self, vals: list[float]) -> bool:
        hi, lo = max(vals), min(vals)
        return hi > 0 and hi - lo <= self.tol * hi

    def rank_counts(self) -> list[float]:
        return [sum(c) for _, c in sorted(self.counts.items())]


def f6_findings(steps: list[LedgerStep]) -> list[Finding]:
    """Each rank one weight for its tokens, different between ranks, the ranks' totals
    equal while their counts differ: each rank normalised by its own count."""
    hits = []
    for s in steps:
        if not all(s.flat(ws) for ws in s.weights.values()):
            return []  # weights vary within a rank: F5 or a weighting, not this pattern
        rank_w = [ws[0] for _, ws in sorted(s.weights.items())]
        masses = [sum(x * n for x, n in zip(s.weights[r], s.counts[r], strict=True))
                  for r in sorted(s.weights)]
        if s.flat(rank_w):
            continue
        if s.flat(s.rank_counts()) or not (s.flat(masses) or _own_counts(rank_w, masses)):
            return []  # not every rank normalised to a count of its own: not judged here
        hits.append((s, rank_w, masses))
    if not hits:
        return []
    s, rank_w, masses = hits[0]
    if not s.flat(masses):
        return [_own_count_finding(s, rank_w, len(hits), len(steps))]
    big_n = sum(s.rank_counts())
    norm = big_n / s.total  # the weights as multiples of 1/N once they total 1
    u = s.unit
    text = ", ".join(f"rank {r}: {w * norm:.4g}/N for each of {c:g} {u}" for r, w, c in
                     zip(sorted(s.weights), rank_w, s.rank_counts(), strict=True))
    if s.factor is None or not s.near(s.total, 1.0):
        text += " (scaled to a total of 1)"
    return [_mk("F6", "error", None, s.step, None,
                f"{_short(s.site)}: every {one(u)} of a rank carried one weight, but the weights "
                f"differ between ranks by {max(rank_w) / min(rank_w):.3g}x at optimizer step "
                f"{_n(s.step)} ({text}, N = {big_n:g}; {len(hits)} of {len(steps)} step(s)): "
                "each rank "
                f"normalised its loss by its own {one(u)} count and the ranks' gradients were "
                f"then averaged, so a {one(u)} on a rank with fewer {u} weighs more. Common "
                f"DDP practice, but not the large batch's gradient (every {one(u)} 1/N)")]


#: How far apart the ranks' totals may be when each rank divides by a count of its own that
#: is not exactly its loss call's valid count (the HF Trainer's ``num_items_in_batch`` counts
#: labels before the shift): the weights must then differ by clearly more than the totals.
_OWN_COUNT_SPREAD = 1.2


def _own_counts(rank_w: list[float], masses: list[float]) -> bool:
    """Each rank's weight is about 1/its count (the totals within 20 % of each other) and
    the weights differ between ranks by more than the totals do, and by 20 % at least."""
    if min(masses) <= 0 or min(rank_w) <= 0:
        return False
    m_spread = max(masses) / min(masses)
    w_spread = max(rank_w) / min(rank_w)
    return m_spread <= _OWN_COUNT_SPREAD and w_spread >= _OWN_COUNT_SPREAD \
        and w_spread > 2 * (m_spread - 1) + 1


def _own_count_finding(s: LedgerStep, rank_w: list[float], hits: int, steps: int) -> Finding:
    """F6 where each rank divided by a count of its own near, not at, its valid count."""
    u = s.unit
    text = ", ".join(f"rank {r}: 1/{1 / w:.4g} for each of {c:g} {u}" for r, w, c in
                     zip(sorted(s.weights), rank_w, s.rank_counts(), strict=True))
    return _mk("F6", "error", None, s.step, None,
               f"{_short(s.site)}: every {one(u)} of a rank carried one weight, but the weights "
               f"differ between ranks by {max(rank_w) / min(rank_w):.3g}x at optimizer step "
               f"{_n(s.step)} ({text}; {hits} of {steps} step(s)): each rank normalised its "
               f"loss by a count of its own and the ranks' gradients were then averaged, so a "
               f"{one(u)} on a rank with fewer {u} weighs more. Not the large batch's gradient, "
               f"which gives every {one(u)} of the window one weight")


def f5_across_findings(steps: list[LedgerStep]) -> list[Finding]:
    """F5 over the ranks: in each micro-step every rank gave its tokens one weight, the same
    on all ranks, and each micro-step's tokens over all ranks weighed the same total, while
    those micro-steps' counts differed: the loss of each micro-step was divided by its own
    count over the ranks (a count all-reduced per micro-step), a mean of per-micro-step
    means. Every step where the weights differ between micro-steps must show it; a step
    whose ranks weigh a micro-step's tokens apart is another pattern (not judged here)."""
    hits = []
    for s in steps:
        ks = {len(ws) for ws in s.weights.values()}
        # (a term of a summed loss too: the gradient its call's output received is that
        # term's weight whatever the other terms add, so its micro-steps compare alike)
        if len(ks) != 1 or (k := ks.pop()) < 2:
            continue
        ranks = sorted(s.weights)
        if any(len(s.counts[r]) != k for r in ranks):
            continue
        per_micro = []
        for m in range(k):
            wm = [s.weights[r][m] for r in ranks]
            if not s.flat(wm):
                return []
            per_micro.append(wm[0])
        if s.flat(per_micro):
            continue
        masses = [sum(s.weights[r][m] * s.counts[r][m] for r in ranks) for m in range(k)]
        counts = [sum(s.counts[r][m] for r in ranks) for m in range(k)]
        if not s.flat(masses) or s.flat(counts):
            return []
        hits.append((s, per_micro, counts, masses))
    if not hits:
        return []
    s, per_micro, counts, masses = hits[0]
    u, k = s.unit, len(per_micro)
    big_n = sum(counts)
    return [_mk("F5", "error", None, s.step, None,
                f"{_short(s.site)}: at optimizer step {_n(s.step)} the {k} micro-steps held "
                f"{', '.join(f'{c:g}' for c in counts)} {u} over the {len(s.weights)} ranks, "
                f"and after {ENGINES.get(s.engine, s.engine)}'s reduction each micro-step's "
                f"{u} weighed the same total ({masses[0]:.4g}) whatever their count: one "
                f"{one(u)} weighed {min(per_micro):.4g} to {max(per_micro):.4g} "
                f"({max(per_micro) / min(per_micro):.3g}x apart; the same on every rank within "
                f"a micro-step) instead of one weight for all {big_n:g} {u} "
                f"({len(hits)} of {len(steps)} step(s)): each micro-step's "
                f"{'loss' if s.sole else 'loss term there'} was divided by "
                f"its own {one(u)} count over the ranks, a mean of per-micro-step means",
                title_=f"mean of per-micro-batch means over the ranks (uneven {one(u)} counts)",
                fix=f"Divide by the window's {one(u)} count over all its micro-steps and ranks "
                    "(sum the counts of the K micro-batches, all-reduce once before the "
                    "window), times the world size under DDP/FSDP's average, and not by K.")]


def total_in_f6(f: Finding, s: LedgerStep, target: float) -> Finding:
    """F6's evidence with the step's total weight (W or 1/W), which its fix also mends."""
    engine = ENGINES.get(s.engine, s.engine)
    return dataclasses.replace(f, evidence=(
        f"{f.evidence}; after {engine}'s reduction the {s.unit} of every step also carried a "
        f"total weight of {s.total:.4g} ({'1/W' if target < 1 else 'W'}, where the large "
        f"batch's mean gives 1): a normalisation by the {one(s.unit)} count over all ranks, "
        "as the fix says, sets that total to 1 as well"))
