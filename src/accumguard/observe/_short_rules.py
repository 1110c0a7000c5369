"""Windows shorter than K, judged by what surrounds them (split from :mod:`.rules`).

The decision is :func:`accumguard.observe._shared_rules.short_window`, the one the runtime
guard makes when the window after a short one closes; here it is folded over a finished
run's windows: the first window short and the next whole (F13, the counter's origin), a
step in the middle of a pass over the DataLoader (F13, the boundary off), windows of one
backward in a row that the run-wide F1 rule (:func:`accumguard.observe.rules._f1`) does not
cover. An epoch's last window, the run's last one and a resumed run's first window (it
began on the restored gradient of a saved partial window) are right.

No torch here, as in :mod:`.rules`.
"""

from __future__ import annotations

from accumguard.observe import _shared_rules as shared
from accumguard.observe._records import Finding, KResolution, StepWindow, _mk, _n

__all__ = ["continued_first", "short_window_findings"]


def continued_first(windows: list[StepWindow], k: int | None) -> StepWindow | None:
    """The run's first window when it continues a saved partial window (a resumed run that
    restored the gradient it saved): fewer than K backward passes and a gradient already in
    ``.grad`` before its first one (the conservation verdict's "stale" part). Only the
    run's first optimizer step (step 0): the callbacks judge each window on its own, and a
    later window that began on a gradient is a leak (F7)."""
    if not windows or k is None or k < 2 or windows[0].step != 0:
        return None
    w = windows[0]
    cons = w.conservation
    stale = cons is not None and cons.reason == "stale"
    return w if shared.continues_saved_window(w.window, k, first=True, stale=stale) else None


def short_window_findings(rank: int, windows: list[StepWindow], res: KResolution,
                          *, f1_found: bool) -> list[Finding]:
    """One finding per class for the run's short windows (``f1_found``: the run-wide F1
    rule already spoke). A window longer than K anywhere means the loop sizes its windows
    (a token budget): then the short ones are sizes too, judged by the window-size rules."""
    k = res.k
    windows = [w for w in windows if w.window]
    if k is None or k <= 1 or not windows or any(w.window > k for w in windows):
        return []
    passes = any(w.data_pass_starts for w in windows)
    continued = continued_first(windows, k)
    out: list[Finding] = []
    said: set[str] = set()
    serials = [w.opt_serial for w in windows]
    for i, w in enumerate(windows):
        n = w.window
        if not shared.early_step(n, k, w.forwards or ()):
            continue
        nxt = windows[i + 1] if i + 1 < len(windows) else None
        if nxt is not None and serials[i] is not None and serials[i] not in serials[i + 1:]:
            # its optimizer never stepped again (another optimizer object took over: a
            # large-batch reference run after the training, a second phase): its last window
            nxt = None
        ends = (0 in (nxt.data_pass_starts or [])) if nxt is not None and passes else (
            False if passes else None)
        verdict = shared.short_window(n, k, first=i == 0,
                                      nxt=None if nxt is None else nxt.window,
                                      last=nxt is None, ends_pass=ends,
                                      continued=w is continued)
        if verdict in ("F1", "F13") and verdict not in said:
            f = _finding(rank, verdict, i, windows, res, passes, f1_found)
            if f is not None:
                said.add(verdict)
                out.append(f)
    return out


def _finding(rank: int, verdict: str, i: int, windows: list[StepWindow], res: KResolution,
             passes: bool, f1_found: bool) -> Finding | None:
    k = res.k
    assert k is not None
    w = windows[i]
    n, step = w.window, w.step
    sev = "error" if res.declared else "note"
    if verdict == "F1":
        if f1_found:
            return None
        return _mk("F1", "error" if res.strength in ("flag", "runtime") else "note", rank,
                   step, 0, f"optimizer steps {_n(step)} and the one next to it each came after "
                   f"a single backward pass (K = {k}, {res.source}), not at the end of a "
                   "pass over the data nor of the run: the loop steps every micro-step there")
    if i == 0:
        rest = [x.window for x in windows[1:]]
        steady = all(m <= k for m in rest) and 2 * rest.count(k) >= len(rest)
        return _mk("F13", "error" if res.declared or (len(windows) >= 3 and steady)
                   else "note", rank, step, n - 1,
                   f"the first optimizer step came after {n} backward pass(es), the next after "
                   f"{windows[1].window} (K = {k}): the boundary test counts from the wrong "
                   "origin (e.g. `i % K == 0` with i from 0), or a resumed run did not restore "
                   "the saved window's gradient; only the last window of an epoch or run may "
                   "be short")
    if not passes:
        return None
    return _mk("F13", sev, rank, step, n - 1,
               f"optimizer step {_n(step)} came after {n} of K = {k} backward passes in the "
               "middle of a pass over the DataLoader (the pass went on after it; not an "
               "epoch's last window): the boundary is off (a counter reset or shifted), so "
               "this window and the large batch differ")
