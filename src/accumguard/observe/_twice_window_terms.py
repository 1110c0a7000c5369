"""A log-prob term normalised over its window's token count and divided by K as well (per
rank, pure Python, no torch).

The loss of every micro-step is a sum of terms; one of them is a per-token log-prob
selection (``log_softmax`` + ``gather``: an SFT NLL beside a DPO term) whose divisors are,
in every micro-step of every window judged, the window's selected-token count (the sum of
the selection's tokens over the window's micro-steps, taking at least two values across
windows or micro-steps: a count, not a coefficient) and, once more, exactly K (a division
by K, or a factor 1/K). ``(dpo + alpha * nll_sum / n_window) / K``: the window normalisation
already makes the window's tokens weigh 1, the /K leaves them 1/K of the term's coefficient.
Judged where the optimizer received the window's summed gradient unscaled (conservation,
c = 1: a loop multiplying the gradient by K before the step would undo it) on one rank (on
several, the ledger's rule on the global count speaks). Blind round 81 c_b01.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, _mk, _n, first_per_optimizer
from accumguard.observe._term_reads import _k_divisions, windows_with_terms
from accumguard.observe._weight_rules import WEIGHT_TOL, _is, _short

__all__ = ["twice_window_term_findings"]


def _selected(w: dict[str, Any], site: str, order: int, k: int) -> list[int] | None:
    """Per micro-step the selected tokens of the selection at (site, order), or None."""
    by_micro = {int(r[3]): int(r[4]) for r in w.get("terms") or []
                if r and r[0] == "select" and str(r[1]) == site and int(r[2]) == order}
    return [by_micro[m] for m in range(k)] if sorted(by_micro) == list(range(k)) else None


def _unscaled(w: dict[str, Any]) -> bool:
    cons = w.get("conservation")
    return isinstance(cons, dict) and bool(cons.get("ok")) \
        and float(cons.get("received", 1.0)) <= WEIGHT_TOL \
        and abs(float(cons.get("scale", 0.0)) - 1.0) <= 1e-3


def _findings(rank: int, windows: list[dict[str, Any]]) -> list[Finding]:
    hits: list[tuple[dict[str, Any], list[Any], list[int]]] = []
    judged = 0
    counts_seen: set[int] = set()
    for w, by_micro, k in windows_with_terms(windows):
        judged += 1
        for r0 in by_micro[0]:
            if r0[7] is None or str(r0[3]) != "GatherBackward0":
                continue
            counts = _selected(w, str(r0[7]), int(r0[8]), k)
            if counts is None:
                continue
            n = float(sum(counts))
            recs = [next((r for r in by_micro[m] if int(r[2]) == int(r0[2])), None) for m in range(k)]
            if all(r is not None and _k_divisions(r[4], k) == 1 and sum(
                    1 for op, c in r[4] if str(op) == "/" and _is(float(c), n)) == 1
                   and not any(str(op) == "*" and _is(abs(float(c)), float(k)) for op, c in r[4])
                   for r in recs):  # (a factor K undoing the /K: `sum * K / n_window / K`)
                hits.append((w, r0, counts))
                counts_seen.update(counts)
                break
    if not hits or len(hits) != judged or len(counts_seen) < 2 \
            or not any(_unscaled(w) for w, _, _ in hits):
        return []
    w, x, counts = hits[0]
    k = int(w["window"])
    return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                f"a per-token log-prob term (log_softmax + gather at {_short(str(x[7]))}) is, in "
                f"every micro-step of {len(hits)} window(s), divided by its window's selected "
                f"tokens ({sum(counts)} = {' + '.join(map(str, counts))} in optimizer step "
                f"{_n(w['step'])}) and by K = {k} as well: the window's count already makes its "
                f"tokens weigh 1 in total over the window, the /K leaves them 1/{k} of the "
                "term's coefficient, and the optimizer received the window's sum unscaled "
                "(gradient conservation, scale 1)",
                title_=f"a term normalised by the window's token count is divided by K as well: "
                       f"it weighs 1/{k} of its coefficient",
                fix="Divide by K only the terms that are means over one micro-batch; a term "
                    "already divided by the window's token count is the window's share as it "
                    "is (e.g. loss = dpo_mean / K + alpha * nll_sum / window_tokens).")]


def twice_window_term_findings(rank: int, windows: list[dict[str, Any]], world: int) -> list[Finding]:
    """LOSS_SCALE for a selection term normalised over its window and divided by K again
    (module doc), one rank, judged per optimizer object."""
    if world != 1:
        return []
    return first_per_optimizer(windows, lambda w: w.get("opt_serial"),
                               lambda group: _findings(rank, group))
