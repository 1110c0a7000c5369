"""The log-prob selection rule on the per-term record (:mod:`._losses_terms`), per rank (pure
Python, no torch):

**A log-prob selection normalised over other micro-steps than its window's.** A loss
built from per-token log-probs (``log_softmax`` + ``gather``, TRL's fused LM head) whose
constant divisor is, in a run of consecutive micro-steps sharing it, exactly the count of
tokens (or of sequences) with a gradient in those micro-steps, and the divisor takes at
least two such values (a divisor that never changes could be a coefficient the user
chose): the divisor is a count, and the window's tokens weigh the window's share of it. When every window judged weighs
``1`` (the window's own count) nothing is said; when every window judged weighs the same
other total (a divisor spanning two optimizer steps: about 1/2), the update is that
fraction of the window's token mean: LOSS_SCALE (error). The count identity is the proof
(equal integer counts do not happen by chance across varied lengths); a divisor that is
no such count (an advantage-weighted or per-sequence normalisation) says nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from accumguard.observe._records import Finding, _mk, _n
from accumguard.observe._weight_rules import WEIGHT_TOL, _is, _short

__all__ = ["one_select_per_micro", "selection_findings"]


def one_select_per_micro(w: dict[str, Any], min_k: int) -> list[list[Any]] | None:
    """Per micro-step the one ``select`` record of a window of at least ``min_k`` micro-steps
    (one call site in every micro-step, no zero_grad inside), or None."""
    k = int(w.get("window", 0))
    if k < min_k or int(w.get("zero_grads_between", 0)):
        return None
    by_micro: dict[int, list[list[Any]]] = {}
    for r in w.get("terms") or []:
        if r and r[0] == "select":
            by_micro.setdefault(int(r[3]), []).append(r)
    if sorted(by_micro) != list(range(k)) or any(len(v) != 1 for v in by_micro.values()):
        return None
    recs = [by_micro[m][0] for m in range(k)]
    if len({(str(r[1]), int(r[2])) for r in recs}) != 1:
        return None
    return recs


def _selection_rows(w: dict[str, Any]) -> list[list[Any]] | None:
    """:func:`one_select_per_micro` whose divisor was read in every micro-step."""
    recs = one_select_per_micro(w, 1)
    if recs is None or any(r[6] is None or float(r[6]) <= 0 for r in recs):
        return None
    return recs


def _runs(items: list[tuple[int, list[Any]]]) -> Iterable[list[tuple[int, list[Any]]]]:
    """Maximal runs of consecutive micro-steps sharing one divisor."""
    run: list[tuple[int, list[Any]]] = []
    for it in items:
        if run and not _is(float(it[1][6]), float(run[-1][1][6])):
            yield run
            run = []
        run.append(it)
    if run:
        yield run


def selection_findings(rank: int, windows: list[dict[str, Any]]) -> list[Finding]:
    """LOSS_SCALE for a log-prob selection whose divisor is the count of other micro-steps
    than its window's (module doc)."""
    segments: list[list[tuple[int, list[Any]]]] = []  # consecutive recorded windows
    prev_step = None
    for w in windows:
        recs = _selection_rows(w)
        step = int(w["step"])
        if recs is None:
            prev_step = None
            continue
        items = [(step, r) for r in recs]
        if prev_step is not None and step == prev_step + 1 and segments:
            segments[-1].extend(items)
        else:
            segments.append(items)
        prev_step = step
    proven: dict[int, str] = {}  # id of a record -> its unit ("token" or "sequence")
    spans: list[tuple[list[tuple[int, list[Any]]], str]] = []
    for seg in segments:
        for run in _runs(seg):
            d = float(run[0][1][6])
            tokens = sum(int(r[4]) for _, r in run)
            seqs = sum(int(r[5]) for _, r in run)
            unit = ("token" if abs(d - tokens) < 0.5 else
                    "sequence" if seqs and abs(d - seqs) < 0.5 else None)
            if unit is None:
                continue
            spans.append((run, unit))
            for _, r in run:
                proven[id(r)] = unit
    # a divisor that never changes is indistinguishable from a coefficient the user chose
    # (24 may be "two windows of 12 sequences" or a weight): the proof needs counts that vary
    if len({(u, float(run[0][1][6])) for run, u in spans}) < 2:
        return []
    masses: list[tuple[int, float, str]] = []  # (step, window mass, unit)
    for w in windows:
        recs = _selection_rows(w)
        if recs is None or not all(id(r) in proven for r in recs):
            continue
        units = {proven[id(r)] for r in recs}
        if len(units) != 1:
            continue
        unit = units.pop()
        col = 4 if unit == "token" else 5
        masses.append((int(w["step"]), sum(int(r[col]) / float(r[6]) for r in recs), unit))
    if not masses or any(abs(m - 1.0) <= WEIGHT_TOL for _, m, _ in masses):
        return []
    return [_selection_finding(rank, windows, spans, masses)]


def _selection_finding(rank: int, windows: list[dict[str, Any]],
                       spans: list[tuple[list[tuple[int, list[Any]]], str]],
                       masses: list[tuple[int, float, str]]) -> Finding:
    step, mass, unit = masses[0]
    run, _ = next(((r, u) for r, u in spans if any(s == step for s, _ in r)), spans[0])
    first, last = run[0][0], run[-1][0]
    site = str(run[0][1][1])
    d = float(run[0][1][6])
    k = next(int(w["window"]) for w in windows if int(w["step"]) == step)
    lo, hi = min(m for _, m, _ in masses), max(m for _, m, _ in masses)
    steps = f"optimizer steps {_n(first)}-{_n(last)}" if last != first \
        else f"optimizer step {_n(first)}"
    return _mk("LOSS_SCALE", "error", rank, step, None,
               f"the loss backpropagated at {_short(site)}, built from per-token "
               "log-probs (a log_softmax then gather, or a fused log-prob head), was "
               f"divided by {d:g}, exactly the {unit}s with a gradient in the "
               f"{len(run)} micro-steps of {steps}, while each optimizer step's window has "
               f"{k} micro-steps: each window's {unit}s weighed {lo:.4g}"
               + (f" to {hi:.4g}" if hi - lo > WEIGHT_TOL * hi else "")
               + f" in total instead of 1 ({len(masses)} window(s) judged), so every update "
               f"is that fraction of its window's {unit} mean, and the fraction varies with "
               "the counts. The normaliser spans a different set of micro-steps than the "
               "optimizer step",
               title_="a log-prob loss is normalised by the count of other micro-steps "
                      "than its optimizer step's",
               fix="Normalise each micro-step's loss by the count of the optimizer step's "
                   "own window (the tokens of its K micro-batches, all-reduced over ranks if "
                   "the ranks' gradients are summed), or step the optimizer once per "
                   "normaliser span.")
