"""The decisions the runtime guard and ``watch`` share: one function per decision, two
entry points.

The guard (:mod:`accumguard.runtime._guard_machine`, :mod:`accumguard.runtime.guard`)
calls each one on a single event, before the action runs, so that it can stop it; the
window rules of ``watch`` (:mod:`.rules`, :mod:`._step_rules`) fold the same function over
a finished window's record. Each caller keeps its own words (the guard raises its
exception class with its message; ``watch`` writes a finding); what is decided, and so
which class is named, is decided here once.

No torch here: ``watch`` judges a recording without importing it.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["SyncVerdict", "conservation_class", "double_gating", "engine_resets",
           "micro_sync", "scheduler_ahead"]

#: What one micro-step's gradient synchronisation means for the window (see :func:`micro_sync`)
SyncVerdict = Literal["unsynced_last", "extra", "deferred"]


def micro_sync(decided: bool | None, *, last: bool) -> SyncVerdict | None:
    """One backward's gradient sync (DDP: the flag at its forward decides; FSDP2: the flag
    at the backward) judged by its place in the window.

    ``"unsynced_last"`` (F11): the window's last backward did not all-reduce, so the
    optimizer steps on this rank's own gradient. ``"extra"``: a non-final backward did
    (wasteful, the gradient is unchanged: EXTRA_SYNC). ``"deferred"``: a non-final one did
    not (what deferred sync means). None: the flag is unknown, or the last backward synced.
    """
    if decided is None:
        return None
    if last:
        return "unsynced_last" if decided is False else None
    return "extra" if decided else "deferred"


def engine_resets(stage: int | None, managed: bool | None, boundary: bool | None,
                  coalescing: bool) -> bool:
    """Did this backward run at a DeepSpeed ZeRO-1/2 accumulation boundary, where the engine
    reduces and then resets its gradient partition? Only when the engine manages the
    accumulation and the backward is outside ``coalesce_grad_reduction``/``no_sync``.
    At a non-final backward of a window this is F2: only the last micro-batches reach the
    optimizer."""
    return stage in (1, 2) and bool(managed) and bool(boundary) and not coalescing


def double_gating(ds_ga: int | None, backwards: int) -> bool:
    """F14: DeepSpeed accumulates ``gradient_accumulation_steps`` > 1 itself and the loop ran
    ``backwards`` > 1 backward passes before an ``engine.step()`` call that was not the
    engine's boundary (a K-loop around a K-accumulating engine)."""
    return isinstance(ds_ga, int) and ds_ga > 1 and backwards > 1


def scheduler_ahead(scheduler_steps: int, optimizer_steps: int, *, allowance: int) -> bool:
    """F4: an LR scheduler has stepped more often than its optimizer, by more than
    ``allowance`` (how far ahead a correct loop may be: the guard reads it at the first
    scheduler step, 1 when the loop steps its scheduler before its optimizer, else 0;
    ``watch`` allows 1 for every loop). A scheduler stepped per micro-step runs K times
    ahead of its schedule."""
    return scheduler_steps > optimizer_steps + allowance


def conservation_class(reason: str | None, *, zero_grad_inside: bool) -> str:
    """The class of a broken conservation verdict (the optimizer did not receive the sum of
    the window's backward contributions): gradient left from the previous window (F7,
    ``reason`` "stale"), removed by a ``zero_grad`` inside the window (F3), or removed by
    something else between backwards (F2/F3: an engine reset or a hand-written clear)."""
    if reason == "stale":
        return "F7"
    return "F3" if zero_grad_inside else "F2/F3"
