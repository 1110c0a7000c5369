"""Epochs read from a rank's step records (pure Python): where each pass over a DataLoader
began, how many backward passes, optimizer steps and scheduler steps each pass held, and
what happened to a pass's last partial window.

The DataLoader patch of the observer notes, in each window, the backward count at which a
new pass began (``data_pass_starts``). From those marks this module rebuilds the passes:
a pass is the backward passes from one mark to the next. The window rules (:mod:`.rules`)
already judge a window that spans two passes (F7: leaked or dropped); here:

* :func:`epochs` - the per-pass counts (also the slack of :mod:`._schedules`);
* :func:`short_epoch_findings` - every pass holds fewer micro-batches than K: each window
  is a pass's short tail, and a loop (or framework) dividing by K weighs each one n/K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accumguard.observe._records import Finding, _mk

__all__ = ["Epoch", "epochs", "short_epoch_findings"]


@dataclass(frozen=True)
class Epoch:
    """One pass over a DataLoader as the step records saw it."""

    backwards: int  # backward passes between this pass's start and the next one's
    steps: int  # optimizer steps whose window ended inside this pass
    windows: tuple[int, ...]  # the backward passes of each of those windows


def epochs(steps: list[dict[str, Any]]) -> list[Epoch]:
    """The passes over the data seen in the step records, in order (empty: no DataLoader
    pass was seen). Backward passes before the first mark are not a pass (data made by
    hand before the first ``for`` over a DataLoader); the last pass ends at the last step
    (backward passes after it were never stepped)."""
    starts: list[int] = []  # global backward index of each pass start
    ends: list[int] = []  # global backward index after each window's last backward
    total = 0
    for s in steps:
        n = int(s.get("backwards", 0) or 0)
        for j in s.get("data_pass_starts") or []:
            if isinstance(j, int) and 0 <= j <= n:
                starts.append(total + j)
        total += n
        ends.append(total)
    if not starts:
        return []
    out = []
    bounds = [*starts, total]
    for a, b in zip(bounds, bounds[1:], strict=False):
        wins = []
        prev = a
        for e in ends:
            if a < e <= b:
                wins.append(e - prev)
                prev = e
        out.append(Epoch(b - a, len(wins), tuple(wins)))
    return out


def complete_epochs(steps: list[dict[str, Any]]) -> bool:
    """Whether the run's passes over the data all held the same number of backward passes
    (two or more passes): the run went through its last pass to the end, it did not break
    out of it (a ``max_steps`` cut ends a pass early)."""
    eps = epochs(steps)
    return len(eps) >= 2 and len({e.backwards for e in eps}) == 1


def short_epoch_findings(rank: int, steps: list[dict[str, Any]], k: int | None,
                         framework: str | None) -> list[Finding]:
    """Every pass over the data shorter than K: each optimizer step's window is one whole
    pass of n < K micro-batches. A note with the counts: the loss-weight rules judge
    whether each short window was divided by K (F7) or by its own count."""
    if k is None or k < 2:
        return []
    eps = [e for e in epochs(steps) if e.backwards]
    if len(eps) < 2 or not all(e.backwards < k for e in eps):
        return []
    sizes = sorted({e.backwards for e in eps})
    who = f"{framework} " if framework else ""
    return [_mk("F7", "note", rank, None, None,
                f"all {len(eps)} passes over the DataLoader held fewer micro-batches than K = "
                f"{k} ({', '.join(map(str, sizes))} each): {who}stepped at the end of each "
                f"pass, so every optimizer step came after a short window of "
                f"{'/'.join(map(str, sizes))} micro-step(s), never K. Each step is the large "
                "batch of that epoch only if its loss was normalised by the window's own "
                "count; divided by K it is too small",
                title_=f"every epoch shorter than K = {k}: each optimizer step closes a short "
                       "window",
                fix=f"Use K <= the batches per epoch ({min(sizes)}), or normalise each "
                    "window's loss by its own count (the last window of an epoch is short).")]
