"""A rule on losses built by hand as a sum of means (pure Python, no torch): **one mean
term divided by K, another not**.

When no term of a backward's sum is a recorded loss call (a DPO loss from summed
log-probs plus an SFT term from a ``log_softmax`` + ``gather`` selection, two regression
heads written as ``((y - t) ** 2).mean()``), the term rules that judge against a recorded
call (:mod:`._term_rules`) have no reference. This rule judges the terms against each
other: in every backward of every window of K >= 2 micro-steps, each term is a mean over
the micro-batch's elements; one of them is divided by exactly K, written as a division
(``nll / grad_accum``), and another is divided by nothing that may hold K. Summed over the
window, the first weighs its coefficient and the second K times its coefficient: their
ratio in the update is K x the ratio the loss's own expression states for the large batch
(``dpo + w * nll / K`` accumulates ``K * dpo_mean + w * nll_mean``).

Not judged: a term with a factor that could not be read; a term that is a sum (its
large-batch meaning is the sum over micro-batches); a term whose constants may hold a 1/K
(``aux * 0.0025`` with K = 4); a term divided by K twice beside one divided once (the
division may be the engine's); a recorded loss call in the sum (the term rules' case); a
pattern not in every window of the optimizer's run.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, _mk
from accumguard.observe._term_reads import _k_divisions, _may_hold_k, windows_with_terms
from accumguard.observe._weight_rules import _is, _short

__all__ = ["mean_terms_findings"]


def _by_slash(divs: list[list[Any]], k: int) -> int:
    """Divisions by exactly ``k`` written as a division (``* 0.25`` may be a coefficient)."""
    return sum(1 for op, c in divs if str(op) == "/" and _is(float(c), float(k)))


def _mean(r: list[Any]) -> bool:
    """A term from torch ops with a mean above it and every factor read."""
    return r[7] is None and not r[6] and bool(r[5])


def _coef(divs: list[list[Any]], k: int) -> float:
    """The term's constants but its divisions by K."""
    out = 1.0
    for op, c in divs:
        if str(op) == "*":
            out *= float(c)
        elif not _is(float(c), float(k)):
            out /= float(c)
    return out


def mean_terms_findings(rank: int, windows: list[dict[str, Any]]) -> list[Finding]:
    """LOSS_SCALE for a hand-built mean term not divided by K beside one that is (module
    doc), over one optimizer's windows; [] unless the pattern holds in every window whose
    backwards are sums of the same terms."""
    found: list[tuple[dict[str, Any], list[Any], list[Any]]] = []
    judged = 0
    for w, by_micro, k in windows_with_terms(windows):
        judged += 1
        per_ordinal: dict[int, list[list[Any]]] = {}
        for rs in by_micro.values():
            for r in rs:
                per_ordinal.setdefault(int(r[2]), []).append(r)
        if any(not _mean(r) for rs in per_ordinal.values() for r in rs):
            return []
        divided = [rs for rs in per_ordinal.values()
                   if all(_by_slash(r[4], k) == 1 and _k_divisions(r[4], k) == 1 for r in rs)]
        plain = [rs for rs in per_ordinal.values()
                 if all(_k_divisions(r[4], k) == 0 and not _may_hold_k(r[4], k) for r in rs)]
        if not divided or not plain:
            return []
        found.append((w, plain[0][0], divided[0][0]))
    if not found or len(found) != judged:
        return []
    w, x, ref = found[0]
    k = int(w["window"])
    cx, cr = _coef(x[4], k), _coef(ref[4], k)
    return [_mk(
        "LOSS_SCALE", "error", rank, int(w["step"]), None,
        f"{_short(str(x[11]))}: the loss of every backward is a sum of means built from torch "
        f"ops; in each of the K = {k} micro-steps of {len(found)} window(s) the term starting "
        f"at {ref[3]} (a mean over {ref[5][-1]} elements, times {cr:.4g}) is divided by "
        f"K = {k} and the term starting at {x[3]} (a mean over {x[5][-1]} elements, times "
        f"{cx:.4g}) is not: accumulation sums {k} micro-batch means of each, so the second "
        f"weighs {k} x {cx:.4g} = {k * cx:.4g} against the first's {cr:.4g}, where the "
        f"large batch's loss, as written, weighs them {cx:.4g} and {cr:.4g}",
        title_=f"a term of the loss is not divided by K while another is: it weighs {k}x "
               "its coefficient",
        fix=f"Divide the whole sum by K (loss = (term_a + coef * term_b) / K), not one term "
            f"of it: operator precedence in `a + coef * b / K` divides only b. If the "
            f"larger weight is wanted, write its coefficient as {k} x coef so the intent "
            "is explicit.")]
