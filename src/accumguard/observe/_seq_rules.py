"""F5 at the sequence level (pure Python, no torch): a log-prob loss averaged over each
micro-batch's sequences, then divided by a constant, while the micro-batches hold different
numbers of sequences.

A GRPO-style loss takes one value per completion (its token mean, or sum) and averages
those over the micro-batch: ``per_seq.mean() / K``. The large batch averages them over all
the window's completions, each weighing 1/N. When a filter (dynamic sampling, groups with
equal rewards dropped) leaves micro-batches of different sizes, each micro-batch's
completions weigh 1/(K n_m) instead: the same signature as a per-micro-batch token mean
(F5), one level up. Judged from the ``select`` records (:mod:`._losses_terms`): in a window
of K >= 2 micro-steps, one selection per micro-step at one site, each reached from the root
through a mean over exactly its own rows first, the constants dividing it the same in every
micro-step, and the rows differing. A selection whose every token got one gradient (a plain
token mean) is the token-level F5's; a divisor that differs between micro-steps (a
normalisation by the window's count) is not judged.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, _mk, _n
from accumguard.observe._selection_rules import one_select_per_micro
from accumguard.observe._weight_rules import _short

__all__ = ["sequence_mean_findings"]


def _rows(w: dict[str, Any]) -> list[list[Any]] | None:
    recs = one_select_per_micro(w, 2)
    if recs is None:
        return None
    if any(len(r) < 10 or int(r[9]) < 1 or r[6] is None or bool(r[7]) for r in recs):
        return None
    d = float(recs[0][6])
    if d <= 0 or any(abs(float(r[6]) - d) > 1e-9 * d for r in recs):
        return None
    return recs


def sequence_mean_findings(rank: int, windows: list[dict[str, Any]]) -> list[Finding]:
    """F5 for a per-micro-batch mean over completions of uneven counts (module doc)."""
    hits = []
    for w in windows:
        recs = _rows(w)
        if recs is None:
            continue
        counts = [int(r[9]) for r in recs]
        if len(set(counts)) > 1:
            hits.append((w, recs, counts))
    if not hits:
        return []
    w, recs, counts = hits[0]
    k = int(w["window"])
    d = float(recs[0][6])
    n = sum(counts)
    return [_mk("F5", "error", rank, int(w["step"]), None,
                f"the loss backpropagated at {_short(str(recs[0][1]))}, built from per-token "
                "log-probs (a log_softmax then gather), was averaged over each micro-batch's "
                f"{' / '.join(str(c) for c in counts)} sequences (one value per sequence, "
                f"then a mean over the micro-batch) and divided by {d:g} in each of the {k} "
                f"micro-steps of optimizer step {_n(w['step'])} ({len(hits)} window(s) with "
                "uneven counts): each micro-batch weighed the same in the step, so a "
                f"sequence weighed 1/({d:g} x {min(counts)}) to 1/({d:g} x {max(counts)}) "
                f"instead of 1/{n}, the large batch's mean over the window's {n} sequences",
                title_="mean of per-micro-batch means / K (uneven sequence counts)",
                fix="Sum the per-sequence values over the micro-batch and divide by the "
                    "number of sequences in the whole window (all micro-steps, and all ranks "
                    "if the ranks' gradients are averaged: then times W), counted before the "
                    "window starts.")]
