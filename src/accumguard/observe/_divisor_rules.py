"""F13 from the loss record: one window's micro-steps divided for different window sizes
(pure Python; :mod:`.rules` runs it with the window rules).

A loss record's constants say which window size each micro-step was normalised for (each of
its n units weighs 1 / (m * n): ``sum / (m * n)``, ``mean / m``). Within one window of K
micro-steps, all of the same count, two different sizes m mean that the window's boundary
and the count its divisor came from disagree.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, StepWindow, _mk, _n
from accumguard.observe._weight_rules import _loss_groups, _short, loss_divisor, one, units

__all__ = ["divided_for_other_size", "mixed_window_findings"]


def _implied_window(r: list[Any]) -> int | None:
    """The window size m a loss record was normalised for, when its value was only scaled
    by constants, one a division at least, and each of its n units weighs exactly
    1 / (m * n) (``sum / (m * n)``, ``mean / m``, a Trainer's ``/ K`` undone by ``* K`` and
    Accelerate's ``/ K`` after it): None otherwise."""
    consts = r[9] if len(r) > 9 and isinstance(r[9], list) else []
    if loss_divisor(r) is None and not (
            any(isinstance(c, list) and c[:1] == ["/"] for c in consts)
            and all(isinstance(c, list) and len(c) == 2 and c[0] in ("/", "*") for c in consts)):
        return None
    n, wt = float(r[3]), abs(float(r[4]))
    if n <= 0 or wt <= 0:
        return None
    m = 1.0 / (wt * n)
    return round(m) if round(m) >= 1 and abs(m - round(m)) <= 1e-3 * m else None


def mixed_window_findings(rank: int | None, windows: list[StepWindow],
                          k_run: int | None = None) -> list[Finding]:
    """F13, the window's boundary and its normalisation disagreeing: one window's
    micro-steps, at one loss call with the same count of units each, normalised for
    different window sizes (the first divided as one of a window of 4, the last as one of
    a window of 2): its units weigh unequally, which no large batch does. The boundary came
    where the script's own count did not expect it (a window counter that ran on across an
    epoch while the divisor follows the epoch's position, or the other way round). Only
    divisions by constants are read, every one an exact window size. Judged on windows of
    the run's K (``k_run``) inside one pass over a DataLoader: a longer window, or one
    spanning two passes, is a leak or a late boundary, which the window-size rules name."""
    for at, w in enumerate(windows):
        k = w.window
        if k < 2 or int(w.zero_grads_between) or w.backwards_per_micro != 1 \
                or (k_run is not None and k != k_run) \
                or any(0 < j < k for j in (w.data_pass_starts or [])):
            continue
        for (site, _), by_micro in sorted(_loss_groups(w).items()):
            if len(by_micro) != k or any(m not in by_micro for m in range(k)):
                continue
            recs = [by_micro[m] for m in range(k)]
            if len({float(r[3]) for r in recs}) != 1 or any(bool(r[5]) for r in recs):
                continue  # counts differ (F5's question), or low-precision weights
            implied = [_implied_window(r) for r in recs]
            sizes = [m for m in implied if m is not None]
            if len(sizes) != k or len(set(sizes)) < 2 or max(sizes) > 4 * k:
                continue
            runs: list[tuple[int, int, int]] = []  # (size, first micro, last micro)
            for i, m in enumerate(sizes):
                if runs and runs[-1][0] == m:
                    runs[-1] = (m, runs[-1][1], i)
                else:
                    runs.append((m, i, i))
            u = units(recs)
            left = _left_in_pass(windows, at, k_run)
            if left is not None and sizes == [min(k, left - j) for j in range(k)]:
                return [_counted_to_pass_end(rank, w, site, recs, sizes, left, u,
                                             _tail_sizes(windows, at, left, site))]
            parts = "; ".join(f"micro-step{'s' if a != b else ''} "
                              f"{a + 1}{f'-{b + 1}' if a != b else ''} as one of a window of "
                              f"{m}" for m, a, b in runs)
            wts = [abs(float(r[4])) for r in recs]
            return [_mk("F13", "error", rank, w.step, None,
                        f"{_short(site)}: the {k} micro-steps of the window before optimizer "
                        f"step {_n(w.step)} each saw {float(recs[0][3]):g} {u}, but the script "
                        f"normalised them for different windows ({parts}): one {one(u)} "
                        f"weighed {min(wts):.4g} or {max(wts):.4g} ({max(wts) / min(wts):.3g}x "
                        f"apart), where the large batch of this window weighs all of its "
                        f"{k * float(recs[0][3]):g} {u} alike. The window's boundary and the "
                        "count its divisor was computed from disagree: a micro-step counter "
                        "that runs on across epochs while the divisor follows the position in "
                        "the epoch (or the other way round)",
                        title_="one window's micro-batches normalised for different window "
                               "sizes: its boundary and its divisor disagree",
                        fix="Derive the boundary and the divisor from one count: reset the "
                            "micro-step counter at each epoch's start (or count windows across "
                            "epochs and size the divisor from the same counter), and divide "
                            "each micro-step by the size of the window it is in.")]
    return []


def _left_in_pass(windows: list[StepWindow], i: int, k_run: int | None) -> int | None:
    """The micro-steps from window ``i``'s first to the end of its pass: through the first
    window from ``i`` on shorter than the run's K (the pass's tail), or the last before a
    new pass begins; None when neither is seen."""
    if k_run is None:
        return None
    total = 0
    for j in range(i, len(windows)):
        total += windows[j].window
        if windows[j].window < k_run:
            return total
        if j + 1 < len(windows) and 0 in (windows[j + 1].data_pass_starts or []):
            return total
    return None


def _tail_sizes(windows: list[StepWindow], at: int, left: int, site: str) -> list[int] | None:
    """The window sizes the pass's last window (the one ``left`` micro-steps from window
    ``at``'s first end in) was normalised for at ``site``, when it is shorter than the windows
    before it and every micro-step says; None otherwise."""
    total = 0
    for w in windows[at:]:
        total += w.window
        if total == left:
            by_micro = next((b for (s, _), b in _loss_groups(w).items() if s == site), None)
            if by_micro is None or sorted(by_micro) != list(range(w.window)):
                return None
            sizes = [_implied_window(by_micro[m]) for m in range(w.window)]
            return None if None in sizes or w.window >= windows[at].window else \
                [int(m) for m in sizes if m is not None]
        if total > left:
            return None
    return None


def _counted_to_pass_end(rank: int | None, w: StepWindow, site: str, recs: list[list[Any]],
                         sizes: list[int], left: int, u: str, tail: list[int] | None
                         ) -> Finding:
    """F7: each micro-step divided by min(K, the micro-batches left in the pass from it on),
    the window's own size never read: the windows ending near the pass's end weigh their
    last micro-batches more (and its short tail window is not normalised as one)."""
    k = w.window
    wts = [abs(float(r[4])) for r in recs]
    given = ", ".join(str(m) for m in sizes)
    tail_text = "" if tail is None else (
        f"; the pass's last window, of {len(tail)} micro-step(s), was divided as one of "
        f"windows of {', '.join(str(m) for m in tail)}"
        + ("" if all(m == len(tail) for m in tail) else f", not {len(tail)}"))
    return _mk("F7", "error", rank, w.step, None,
               f"{_short(site)}: the {k} micro-steps of the window before optimizer step "
               f"{_n(w.step)} each saw {float(recs[0][3]):g} {u}, and were divided as one of "
               f"windows of {given} micro-steps (read from the loss record): each one's "
               f"divisor is min(K, the micro-batches left in the pass from it on), {left} from "
               f"this window's first to the pass's end, not the size of the window it is in "
               f"({k}). One {one(u)} weighed {min(wts):.4g} or {max(wts):.4g} "
               f"({max(wts) / min(wts):.3g}x apart), where the large batch of this window "
               f"weighs all of its {k * float(recs[0][3]):g} {u} alike{tail_text}",
               title_="the divisor counted from each micro-batch to the end of the pass, not "
                      "from the window's start: the windows ending a pass are mis-scaled",
               fix="Divide every micro-step of a window by that window's own size, computed "
                   "once at the window's first micro-step (min(K, micro-batches left in the "
                   "pass) read at the window's start), so a full window divides by K and the "
                   "short tail by its own length.")


def _implied_sizes(windows: list[StepWindow]) -> set[int | None]:
    """The window sizes the micro-steps of ``windows`` were normalised for, at every loss
    call (None for a record that does not say)."""
    out: set[int | None] = set()
    for w in windows:
        for by_micro in _loss_groups(w).values():
            out |= {_implied_window(r) for r in by_micro.values()}
    return out


def divided_for_other_size(rank: int | None, windows: list[StepWindow], k: int
                           ) -> Finding | None:
    """LOSS_SCALE: the run's windows come in two sizes, K and m (an update frequency that
    changes per epoch: fairseq's ``--update-freq 2 4``), and every micro-step of both was
    normalised for a window of m, the other size: each window of K sums K micro-steps
    divided by m, K/m x its large batch, while the windows of m weigh 1. The windows of K
    are the ones the script declared, so their weight is wrong whatever the schedule meant.
    None when that is not what the loss records show."""
    ks = [w for w in windows if w.window == k and w.backwards_per_micro == 1]
    others = [w for w in windows if w.window != k]
    sizes = {w.window for w in others}
    if len(ks) < 2 or len(sizes) != 1 or not ks[0].losses:
        return None
    m = sizes.pop()
    if m < 1 or _implied_sizes(ks) != {m} or _implied_sizes(others) != {m}:
        return None
    site = next(iter(sorted(_loss_groups(ks[0]))))[0]
    return _mk("LOSS_SCALE", "error", rank, ks[0].step, None,
               f"{_short(site)}: the run's windows held {m} or {k} micro-steps (K = {k}: "
               f"{len(others)} window(s) of {m}, {len(ks)} of {k}, e.g. before optimizer step "
               f"{_n(ks[0].step)}), and every micro-step of both was normalised for a window "
               f"of {m} (each loss divided as one of {m} micro-batches, read from the loss "
               f"record): each window of {k} weighs {k / m:.3g} x its large batch, the "
               f"windows of {m} weigh 1",
               title_=f"windows of {k} micro-steps divided as windows of {m}: their "
                      f"gradient is {k / m:.3g} x the large batch's",
               fix=f"Divide each micro-step's loss by the number of micro-steps in its own "
                   f"window (the update frequency in force for that epoch), not by {m}.")
