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

from collections.abc import Sequence
from typing import Literal

__all__ = ["ClipVerdict", "ShortVerdict", "SyncVerdict", "clip_verdict", "conservation_class",
           "continues_saved_window", "double_gating", "early_step", "engine_resets", "grew",
           "long_window_class", "micro_sync", "overrun", "scheduler_ahead", "short_window",
           "step_without_backward"]

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


def double_gating(ds_ga: int | None, backwards: int, window: int) -> bool:
    """F14: DeepSpeed accumulates ``gradient_accumulation_steps`` > 1 itself and the loop ran
    ``backwards`` > 1 backward passes before an ``engine.step()`` call that was not the
    engine's boundary (a K-loop around a K-accumulating engine), and the optimizer's window
    holds more than that many backwards so far (``window``). A loop that runs the window's
    K backwards (in one ``coalesce_grad_reduction()`` block) and then calls ``engine.step()``
    K times steps after exactly K backwards: the engine's own accumulation, not a second
    gate around it."""
    return isinstance(ds_ga, int) and ds_ga > 1 and backwards > 1 and window > ds_ga


def scheduler_ahead(scheduler_steps: int, optimizer_steps: int, *, allowance: int) -> bool:
    """F4: an LR scheduler has stepped more often than its optimizer, by more than
    ``allowance`` (how far ahead a correct loop may be: the guard reads it at the first
    scheduler step, 1 when the loop steps its scheduler before its optimizer, else 0;
    ``watch`` allows 1 for every loop). A scheduler stepped per micro-step runs K times
    ahead of its schedule."""
    return scheduler_steps > optimizer_steps + allowance


def conservation_class(reason: str | None, *, zero_grad_inside: bool,
                       engine_reset: bool = True) -> str:
    """The class of a broken conservation verdict (the optimizer did not receive the sum of
    the window's backward contributions): gradient left from the previous window (F7,
    ``reason`` "stale"), removed by a ``zero_grad`` inside the window (F3), or removed by
    something else between backwards: F2/F3 where an engine's reset may be it
    (``engine_reset``: a DeepSpeed engine, or not known), F3 where none can be (a torch
    loop: a hand-written clear, a callback or hook that sets ``.grad`` to None)."""
    if reason == "stale":
        return "F7"
    return "F3" if zero_grad_inside or not engine_reset else "F2/F3"


#: below this share of the window's gradient (by absolute mass) a change between backward
#: passes is rounding's, not a removal nor an addition
CHANGE_MASS = 0.005


def grew(reason: str | None, lost: float, added: float, *, zero_grad_inside: bool,
         engine_reset: bool) -> bool:
    """A broken conservation ("wiped") where the gradient only grew between backward passes,
    by something other than a backward: a term added to ``.grad`` on every micro-step (a
    callback, a hook), or the running sum scaled up. Not F3: nothing was removed, and a term
    divided by K added on each of K micro-steps is the large batch's; what the run sees
    cannot tell it from a term added in full (LOSS_SCALE, K times), so neither the guard nor
    ``watch`` makes it an error."""
    return (reason == "wiped" and not zero_grad_inside and not engine_reset
            and lost < CHANGE_MASS <= added)


#: Where a clip (or a GradScaler unscale) ran against the window it acts on (see
#: :func:`clip_verdict`)
ClipVerdict = Literal["inside", "outside"]


def clip_verdict(backwards: int, size: int) -> ClipVerdict | None:
    """F8: a ``clip_grad_norm_`` (or ``scaler.unscale_``) after ``backwards`` of the
    ``size`` backward passes of the window that the next optimizer step consumes.

    ``"inside"`` (F8 when the window goes on: a later backward adds to the clipped sum, so
    the micro-batches' gradients were shrunk separately): after at least one of them and
    before the last. ``"outside"`` (a note: it changes nothing the next step receives):
    before the window's first backward (after the previous step, or before any backward
    at all); the gradient it clips is none of this window's (zero, or the previous
    window's, which the conservation check calls F7 if it reaches the step). None: after
    the window's last backward, where clipping belongs.

    The guard calls it at the clip (``backwards`` 0 after a step: the next window has not
    started); ``watch`` calls it per recorded clip with the window's real length (a window
    that an early step cut short is F1's, not F8's)."""
    if backwards <= 0:
        return "outside"
    return "inside" if backwards < size else None


def early_step(backwards: int, size: int, forwards: Sequence[int] = ()) -> bool:
    """F1: an optimizer step after ``backwards`` backward passes, at least one and fewer
    than the ``size`` the window holds: it applies part of the window's gradient.

    Not when the window's one backward followed ``size`` or more forwards (``forwards``:
    the forwards before each backward): the loop summed the window's losses before one
    backward, which is the large batch's gradient. A step with no backward at all is not
    this rule's (a no-op when every gradient is None; a second step otherwise)."""
    if backwards <= 0 or backwards >= size:
        return False
    return not (backwards == 1 and max(forwards, default=0) >= size)


def overrun(backwards: int, size: int) -> bool:
    """F13 (or F7, see :func:`long_window_class`): one more backward pass after
    ``backwards`` of a window that holds ``size`` runs past the window's boundary; the
    step it should have had comes late, on more micro-batches than the large batch."""
    return backwards >= size


def long_window_class(spans_passes: bool) -> str:
    """The class of a window longer than K: micro-steps left at the end of one pass over the
    DataLoader (an epoch) and stepped together with the next pass's first ones (F7, a
    leak), or a boundary that comes late inside one pass (F13, a counter off by one)."""
    return "F7" if spans_passes else "F13"


#: What a window shorter than K means (see :func:`short_window`)
ShortVerdict = Literal["F1", "F13", "unsure", "wait"]


def short_window(backwards: int, size: int, *, first: bool, nxt: int | None, last: bool,
                 ends_pass: bool | None,
                 continued: bool = False) -> ShortVerdict | None:
    """A window closed by an optimizer step after ``backwards`` of the ``size`` backward
    passes it should hold (:func:`early_step` said it is short), judged by what surrounds it.

    ``nxt``: the backward passes of the window after it (None: none, or not known yet);
    ``last``: the run ended after it; ``ends_pass``: the next window began
    a new pass over a DataLoader (None: no DataLoader pass was seen in the run, so an epoch's
    end cannot be told); ``first``: the run's first window; ``continued``: it is the first
    window and began on a gradient already in ``.grad`` (a resumed run that restored a saved
    partial window, see :func:`continues_saved_window`).

    * None: a pass's (an epoch's) last window, the run's final partial window, or a resumed
      window: a short window is right there (its scale is judged from the loss record);
    * ``"F1"``: a window of one backward followed by another: the loop steps every
      micro-step;
    * ``"F13"``: the first window short and the next one whole (the counter's origin is off:
      ``i % K == 0`` with i from 0), or a step in the middle of a pass over the data: the
      boundary is off (a counter reset, a resume that lost the saved window's gradient);
    * ``"unsure"``: a short window in the middle of a run that reads no DataLoader: an
      epoch's last window or an early step, which nothing tells apart (a note at most);
    * ``"wait"``: what follows is not known yet (the guard decides at the next step).

    The guard calls it at the step with what it knows so far and again once the next window
    closed (or the run ended); ``watch`` calls it once per window of the finished run."""
    if not 0 < backwards < size or ends_pass or continued:
        return None
    if last:
        return None
    if nxt is None:
        return "wait"
    if backwards == 1 and nxt == 1:
        return "F1"
    if first and nxt >= size:
        return "F13"
    return "unsure" if ends_pass is None else "F13"


def continues_saved_window(backwards: int, size: int, *, first: bool, stale: bool) -> bool:
    """A resumed run whose first window continues a window saved mid-way: the run's first
    window holds fewer than ``size`` backward passes and began on a gradient already in
    ``.grad`` (``stale``: the restored partial sum). The step then applies the saved
    micro-batches' gradient and this window's: the large batch, when the loop restored the
    gradient it saved. Neither a leak (F7) nor an off-by-one origin (F13)."""
    return first and 0 < backwards < size and stale


def step_without_backward(moved: bool | None) -> str | None:
    """An optimizer step with no backward pass since the same optimizer's previous step:
    EXTRA_STEP when it changed the parameters (``moved``: measured by ``watch``; the guard
    knows it before the step only when a gradient left in ``.grad`` is applied again), else
    nothing (a no-op step: every gradient None, or zero with no momentum). It is not F1: no
    micro-batch's gradient was cut short; one window's gradient is applied twice, or the
    optimizer's state moves the parameters a second time."""
    return "EXTRA_STEP" if moved else None
