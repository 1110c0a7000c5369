"""F7 and F13 from the loss record's weights: a short window (fewer than K micro-steps)
whose tokens weigh n/K while every full window's weigh 1 was divided by K instead of its own
size: at the end of the run or of a DataLoader pass (F7), or in the middle of a pass (F13, the
boundary moved). The weights and masses are read by :mod:`._weight_rules` (pure Python, no
torch)."""

from __future__ import annotations

from accumguard.observe._records import Finding, StepWindow, _mk, _n
from accumguard.observe._weight_rules import _divides_by, _f7_mass, _Mass, _near, _short

__all__ = ["partial_window_findings"]


def partial_window_findings(rank: int | None, windows: list[StepWindow],
                            k: int | None, resumes: list[int] | None = None) -> list[Finding]:
    """F7 from the loss record: every full window of K micro-steps weighs its tokens 1 in
    total (the loop normalises a window to its mean), and the short last window of the
    run or of a pass over the data, n < K micro-steps, weighs them n/K: it was divided by
    K instead of its own n. (A last window normalised by its own size or count weighs 1;
    a dropped one is not there.)"""
    if k is None or k < 2:
        return []
    masses = [_f7_mass(w) for w in windows]
    full = [m for w, m in zip(windows, masses, strict=True)
            if m is not None and int(w.window) == k]
    if not full:
        return []
    # every full window weighs the same: 1 for a loss normalised to the window's mean, or
    # the sum of the coefficients of a loss of several terms (CE + 0.5 * MSE: 1.5)
    ref = sum(m.mass for m in full) / len(full)
    if ref <= 0 or not all(_near(m.mass, ref, m.low) for m in full):
        return []
    one = _near(ref, 1.0, full[0].low)
    for i, (w, m) in enumerate(zip(windows, masses, strict=True)):
        n = int(w.window)
        if m is None or not 1 <= n < k:
            continue
        last = i == len(windows) - 1 or 0 in (windows[i + 1].data_pass_starts or [])
        if not one and not all(_each_call_over_k(x, k) for x in (*windows, w)
                               if int(x.window) in (k, n)):
            continue  # a window weighing other than 1 is judged only when every loss call
            # is divided by exactly K (a sum loss, or a mean never divided, is not F7)
        if last and _near(m.mass, n / k * ref, m.low):
            if (resumed := _resumed_pass(windows, i, k, resumes or [])) is not None:
                return [_misaligned(rank, windows, i, resumed, k, m)]
            weighed = (m.words(n, k, at=False) if one else
                       f"its {m.unit} carried a total weight of {m.mass:.4g} = {n}/{k} of "
                       f"the {ref:.4g} each full window carried (a loss of several terms)")
            return [_mk("F7", "error", rank, w.step, n - 1,
                        f"{_short(m.site)}: the last window before optimizer step "
                        f"{_n(w.step)} had {n} of K = {k} micro-steps"
                        + (" (the end of the run)" if i == len(windows) - 1
                           else " (the end of a pass over the DataLoader)")
                        + f", and {weighed}, while each of the {len(full)} full "
                        f"window(s) seen weighed {ref:.4g}: the partial window was divided by "
                        f"K instead of its {n} micro-steps, so its update is {n}/{k} of its "
                        "mean gradient",
                        title_=f"a short last window ({n} of K = {k} micro-steps) divided by K: "
                               f"its update is {n}/{k} of its mean gradient")]
    return _mid_run_short(rank, windows, masses, k, len(full)) if one else []


def _resumed_pass(windows: list[StepWindow], i: int, k: int, resumes: list[int]) -> int | None:
    """The optimizer step of the resume whose pass window ``i`` (a short window at a pass's
    end) ends, when every other pass end in ``windows`` fell on a full window; else None."""
    start = next((j for j in range(i, -1, -1) if 0 in (windows[j].data_pass_starts or [])), None)
    if start is None or int(windows[start].step) not in resumes:
        return None
    ends = [j for j in range(len(windows)) if j != i and (
        j == len(windows) - 1 or 0 in (windows[j + 1].data_pass_starts or []))]
    if not ends or any(int(windows[j].window) != k for j in ends):
        return None
    return int(windows[start].step)


def _misaligned(rank: int | None, windows: list[StepWindow], i: int, resumed: int, k: int,
                m: _Mass) -> Finding:
    w, n = windows[i], int(windows[i].window)
    return _mk("F13", "error", rank, w.step, n - 1,
               f"{_short(m.site)}: the run resumed before optimizer step {_n(resumed)} (an "
               f"optimizer's saved state was loaded) into a new pass over the DataLoader, and "
               f"that pass ended on a window of {n} of K = {k} micro-steps (before optimizer "
               f"step {_n(w.step)}), {m.words(n, k, at=False)}; every other pass end the run "
               f"saw fell on a full window of {k}: the resume restarted inside a window (it "
               f"skipped a number of micro-batches that is no multiple of K), so micro-batches "
               f"are trained twice or skipped and the pass's last window is short",
               title_="a resume restarted inside a window: the windows after it are "
                      "misaligned and the pass ends on a short window",
               fix="Resume at the micro-batch after the last completed window: skip the "
                   "pass's completed optimizer steps x K micro-batches (with Accelerate: "
                   "accelerator.skip_first_batches(loader, steps_done_in_epoch * "
                   "gradient_accumulation_steps)), and restore the window counter with it.")


def _each_call_over_k(w: StepWindow, k: int) -> bool:
    """Every loss record of the window is a mean with a division by exactly ``k`` among the
    constants between it and the root (``loss / K`` over a loss of several terms)."""
    recs = w.losses or []
    return bool(recs) and all(len(r) > 9 and str(r[6]) == "mean" and _divides_by(r[9] or [], k)
                              for r in recs)


def _mid_run_short(rank: int | None, windows: list[StepWindow], masses: list[_Mass | None],
                   k: int, n_full: int) -> list[Finding]:
    """A short window in the middle of the run, n < K micro-steps divided by K (weight n/K,
    while every full window weighed 1): its update is n/K of its mean gradient whatever
    ended it. Inside a DataLoader pass the boundary moved (F13: a counter reset, a resume
    that restarted at the saved micro-batch); with no DataLoader seen, a one-off short
    window is read as F13 and recurring ones as epochs' ends (F7); the evidence says both."""
    passes = any(w.data_pass_starts for w in windows)
    short = []
    for i, (w, m) in enumerate(zip(windows, masses, strict=True)):
        n = int(w.window)
        if m is None or not 1 <= n < k or i in (0, len(windows) - 1):
            continue  # (the first window: a resumed run's saved one; the last: F7 above)
        if 0 in (windows[i + 1].data_pass_starts or []) or not _near(m.mass, n / k, m.low):
            continue  # a pass's end (F7 above) or normalised by its own size
        short.append((w, m, n))
    if not short:
        return []
    w, m, n = short[0]
    cls = "F13" if passes or len(short) == 1 else "F7"
    where = ("inside a pass over the DataLoader" if passes else
             "in the middle of the run (no DataLoader pass seen: "
             + ("each such window may be an epoch's end" if cls == "F7" else
                "the only such window; an epoch's end would recur") + ")")
    return [_mk(cls, "error", rank, w.step, n - 1,
                f"{_short(m.site)}: the window before optimizer step {_n(w.step)} had {n} of "
                f"K = {k} micro-steps, {where}, and {m.words(n, k, at=False)}, while each of "
                f"the {n_full} full window(s) seen weighed 1: it was divided by K instead of "
                f"its {n} micro-steps, so its update is {m.mass:.3g}x its mean gradient"
                + (f" ({len(short)} such windows)" if len(short) > 1 else "")
                + (": the window boundary moved (e.g. a counter reset, or a resume that "
                   "restarted at the saved micro-batch instead of the one after it)"
                   if cls == "F13" else ""))]
