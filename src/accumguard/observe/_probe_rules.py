"""F7 for a backward before the first window: a probe whose gradient reached the first step.

A trainer that runs one forward/backward before training (a sanity check that every
parameter gets a gradient, a warm-up of the graph, a profiling pass) and does not clear it
adds that gradient to the first window's: the first optimizer step is not the large batch's.
The recording shows it when the first window is longer than K by j backwards while the
windows after it are K, and each of those j backwards came from a call site that no other
window's backward came from (the terms rows carry each backward's site), or, under DDP or
FSDP2, each of those j all-reduced where the loop's windows never sync a first backward
(the sync flags; no loss record needed: a compiled model's loss is not recorded). A longer
first
window made of the loop's own backwards (a budget per step, a resume) is not this.
"""

from __future__ import annotations

from accumguard.observe._records import Finding, StepWindow, _mk

__all__ = ["probe_before_first_window"]


def _sites(w: StepWindow) -> dict[int, str]:
    """The call site of each backward of ``w`` that its terms rows name (micro -> site)."""
    out: dict[int, str] = {}
    for row in w.terms or []:
        if isinstance(row, list) and len(row) >= 5 and row[0] == "mean" \
                and isinstance(row[1], int) and isinstance(row[4], str):
            out.setdefault(row[1], row[4])
    return out


def _synced_apart(first: StepWindow, rest: list[StepWindow], j: int) -> str | None:
    """DDP/FSDP2 (no loss record needed: a compiled model's loss is not recorded): the first
    j backwards all-reduced (sync on), the rest of the first window has exactly the sync
    pattern of every later window, which never syncs its first backward, and nothing cleared
    or lost any gradient in the first window (measured): the j came from outside the loop."""
    flags = list(first.sync_micros or [])
    pattern = [list(w.sync_micros or []) for w in rest]
    cons = first.conservation
    if len(flags) != first.window or not pattern or any(p != pattern[0] for p in pattern) \
            or flags[:j] != [True] * j or flags[j:] != pattern[0] or pattern[0][:1] != [False] \
            or cons is None or not cons.ok or int(first.zero_grads_between or 0):
        return None
    return ("a backward that all-reduced (sync on) before the loop's first micro-step, "
            "whose later windows all-reduce only at their last backward")


def _own_sites(windows: list[StepWindow], j: int) -> str | None:
    """The call sites of the first window's first j backwards when no other backward ran at
    them (the loss records name each backward's site), else None."""
    first = windows[0]
    sites = _sites(first)
    early = [sites.get(i) for i in range(j)]
    if any(s is None for s in early) or len(sites) < first.window:
        return None
    others = {s for w in windows[1:] for s in _sites(w).values()}
    own = {sites[i] for i in range(j, first.window)}
    if not others or any(s in others or s in own for s in early):
        return None
    return ", ".join(sorted({str(s) for s in early}))


def probe_before_first_window(rank: int | None, windows: list[StepWindow], k: int
                              ) -> Finding | None:
    """The F7 error for ``windows`` (one rank's, in order) whose first window carries
    backwards from a site of their own before K of the loop's, or None."""
    if len(windows) < 3 or k < 2:
        return None
    first, rest = windows[0], windows[1:-1]
    j = first.window - k
    if j < 1 or any(w.window != k for w in rest):
        return None
    where = _own_sites(windows, j)
    synced = None if where is not None else _synced_apart(first, rest, j)
    if synced is not None:
        where = synced
    if where is None:
        return None
    return _mk("F7", "error", rank, first.step, j - 1,
               f"a window of {first.window} backward passes before optimizer step 1, every "
               f"later one {k}: the first {j} "
               + (f"ran at {where}, a call site no window's backward ran at again"
                  if synced is None else f"{'was' if j == 1 else 'were'} {where}")
               + " (a sanity check or warm-up pass before training), and "
               + ("its" if j == 1 else "their")
               + " gradient was never cleared, so it was added to the first window's and "
               "optimizer step 1 is not the large batch's",
               title_=("gradient of a backward before training "
                       + (f"({where}) " if synced is None else "")
                       + "leaked into the first optimizer step"),
               fix="clear the gradient after the pass that runs before training "
                   "(model.zero_grad(set_to_none=True) or optimizer.zero_grad()), or run it "
                   "under torch.no_grad() when it needs no gradient")
