"""A term that is a masked mean over its own micro-batch's valid tokens, beside a masked
sum normalised over the whole window (per rank, pure Python, no torch).

The loss is built by hand from a sum of terms: ``((pg + c * kl) * mask).sum() / n_window``
(a masked sum the loss recorder keeps, whose tokens weigh 1 in total over the window: the
large batch's mean, on this rank or over all ranks in the ledger's masses) minus
``coef * (ent * mask).sum() / mask.sum()``, a masked mean over exactly the valid tokens of
that micro-step (the term's one division equals the masked sum's count there, in every
micro-step, the counts taking at least two values). Nothing divides the mean by K, so the
window adds K micro-batch means of it: K x its coefficient, each token weighing
``coef / n_m`` instead of ``coef / N``. An entropy bonus or a KL term written this way
beside a GRPO/PPO objective normalised over the window is the case (blind round 80 c_b02).

Not judged: a term whose constants may hold a 1/K, a division by another count (its own
mask), a term that is itself a sum, anything not in every micro-step of every window judged.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, _mk, _n, first_per_optimizer
from accumguard.observe._term_reads import (
    SELECT_KEY,
    _count_divisor,
    _may_hold_k,
    windows_with_terms,
)
from accumguard.observe._term_rules import Masses
from accumguard.observe._weight_rules import WEIGHT_TOL, _divides_by, _short

__all__ = ["own_count_term_findings"]


def _main(w: dict[str, Any], k: int) -> tuple[tuple[str, int], str, list[int], float] | None:
    """The one objective of the window normalised by hand, in every micro-step: a masked sum
    the loss recorder kept, or a log-prob selection whose every token got one gradient
    (``log_softmax`` + ``gather``, its divisor read): (its key in the ledger's masses, its
    site, its valid tokens per micro-step, their total weight on this rank)."""
    found: list[tuple[tuple[str, int], str, list[int], float]] = []
    sums: dict[tuple[str, int], dict[int, list[Any]]] = {}
    for r in w.get("losses") or []:
        if len(r) > 12 and str(r[12]) == "masked sum" and not r[8]:
            sums.setdefault((str(r[0]), int(r[1])), {})[int(r[2])] = r
    for (site, idx), by_micro in sums.items():
        if sorted(by_micro) == list(range(k)):
            recs = [by_micro[m] for m in range(k)]
            found.append(((site, idx), site, [int(float(r[3])) for r in recs],
                          sum(abs(float(r[4])) * float(r[3]) for r in recs)))
    picks: dict[tuple[str, int], dict[int, list[Any]]] = {}
    for r in w.get("terms") or []:
        if r and r[0] == "select" and r[6] is not None and float(r[6]) > 0 and r[7]:
            picks.setdefault((str(r[1]), int(r[2])), {})[int(r[3])] = r
    for (site, order), by_micro in picks.items():
        if sorted(by_micro) == list(range(k)):
            recs = [by_micro[m] for m in range(k)]
            found.append(((SELECT_KEY + site, order), site, [int(r[4]) for r in recs],
                          sum(int(r[4]) / float(r[6]) for r in recs)))
    return found[0] if len(found) == 1 else None


def _window_mean(w: dict[str, Any], key: tuple[str, int], local: float,
                 masses: Masses | None) -> bool:
    """The objective's tokens weigh 1 over the window: on this rank, or over all ranks."""
    if abs(local - 1.0) <= WEIGHT_TOL:
        return True
    got = (masses or {}).get(int(w["step"]), {}).get(key)
    return got is not None and abs(got[0] - 1.0) <= got[1]


def _own_mean(r: list[Any], count: int, k: int) -> bool:
    """Term ``r`` is a masked mean over exactly ``count`` tokens, its other constants holding
    no 1/K, nothing dividing it by K."""
    if r[6] or r[7] is not None or _divides_by(r[4], k):
        return False
    if _count_divisor(r, count, k) is None:
        return False
    rest = [d for d in r[4] if not (str(d[0]) == "/" and float(d[1]) == float(count))]
    return not _may_hold_k(rest, k)


def own_count_term_findings(rank: int, windows: list[dict[str, Any]],
                            masses: Masses | None = None) -> list[Finding]:
    """LOSS_SCALE for a masked-mean term over its micro-batch's own tokens beside a masked
    sum normalised over the window (module doc); judged per optimizer object."""
    return first_per_optimizer(windows, lambda w: w.get("opt_serial"),
                               lambda group: _findings(rank, group, masses))


def _findings(rank: int, windows: list[dict[str, Any]], masses: Masses | None) -> list[Finding]:
    hits: dict[int, list[tuple[dict[str, Any], list[Any], str, list[int], float]]] = {}
    judged = 0
    for w, by_micro, k in windows_with_terms(windows):
        main = _main(w, k)
        if main is None:
            continue
        key, site, counts, local = main
        if len(set(counts)) < 2 or not _window_mean(w, key, local, masses):
            continue
        judged += 1
        for o in sorted({int(r[2]) for r in by_micro[0]}):
            recs = [next((r for r in by_micro[m] if int(r[2]) == o), None) for m in range(k)]
            got = [r for r in recs if r is not None]
            if len(got) == k and all(_own_mean(r, counts[m], k) for m, r in enumerate(got)):
                hits.setdefault(o, []).append((w, got[0], site, counts, local))
    for _o, found in sorted(hits.items()):
        if len(found) != judged:
            continue  # not in every window judged
        w, x, site, counts, local = found[0]
        k = int(w["window"])
        coef = " x ".join(f"{abs(float(c)):g}" for op, c in x[4]
                          if str(op) == "*" and abs(float(c)) != 1.0) or "1"
        weigh = (f"its {sum(counts)} tokens weigh 1 in total"
                 if abs(local - 1.0) <= WEIGHT_TOL else
                 f"its {sum(counts)} tokens on this rank and the other ranks' weigh 1 in total")
        return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                    f"a term built from torch ops (coefficient {coef}) is, in every micro-step "
                    f"of {len(found)} window(s), a masked mean over exactly its micro-batch's "
                    f"valid tokens ({', '.join(map(str, counts))} in the {k} micro-steps of "
                    f"optimizer step {_n(w['step'])}: the counts of the objective at "
                    f"{_short(site)}), and nothing divides it by K = {k}; that objective, "
                    f"beside it in the same loss, is normalised over the whole window ({weigh}). "
                    f"Accumulated, this term adds {k} micro-batch means: {k}x its coefficient, "
                    f"its tokens weighing {1 / max(counts):.4g} to {1 / min(counts):.4g} (times "
                    "the coefficient) instead of one weight each",
                    title_=f"a term of the loss is a per-micro-batch mean not divided by K: it "
                           f"weighs {k}x its coefficient",
                    fix="Normalise that term like the objective beside it: "
                        "(term * mask).sum() divided by the window's valid-token count (all "
                        "micro-steps, all ranks, times the world size when DDP averages), "
                        "instead of (term * mask).sum() / mask.sum(). If the larger weight is "
                        "wanted, write its coefficient as K x coef so the intent is explicit.")]
    return []
