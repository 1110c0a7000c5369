"""The guard's state machine: phases of a window, the illegal transitions, one message each.

A window is the run of backward passes that one optimizer step consumes. Its phase
(:class:`Phase`) moves ``OPEN -> ACCUMULATING -> FULL -> STEPPED`` and back to ``OPEN``
at the next window's first backward. :data:`ILLEGAL` lists which event is illegal in
which phase; :data:`RULES` holds the one message of every violation (and of every note:
a correct but wasteful or unverifiable pattern, reported and never raised). The
machine knows nothing of hooks: :class:`accumguard.runtime.guard.AccumulationGuard`
feeds it the observation layer's events that concern its model and optimizer.

The message table :data:`RULES` lives in :mod:`._guard_messages` (re-exported here). What
``watch`` judges too (a backward past the window, a step inside it, a clip by its place, a
micro-step's sync, the scheduler's count, a broken conservation verdict, a step with no
backward) is decided by the functions of :mod:`accumguard.observe._shared_rules`, called
here on one event before the action runs and folded there by ``watch`` over a finished
window. A step inside the window is the exception: only what follows tells an epoch's (or
the run's) last window from an off-by-one boundary (F13) or a step per micro-step (F1), so
:func:`~accumguard.observe._shared_rules.short_window` is called when the next window
closes, before its step runs.

Checks that need the numbers (did the gradient removed inside the window reach the
optimizer? did ranks agree?) are verdicts computed by :mod:`accumguard.observe` and
passed in with the step; the machine only decides what they mean.
"""

from __future__ import annotations

import enum
import logging
import warnings
from collections import deque
from collections.abc import Callable
from typing import NamedTuple, TypedDict

from accumguard.core.errors import AccumguardWarning, ConfigError, UsageError, rank_prefix
from accumguard.core.taxonomy import fix_for
from accumguard.core.window import Conservation, StepRecord
from accumguard.observe._shared_rules import (
    clip_verdict,
    conservation_class,
    continues_saved_window,
    early_step,
    grew,
    long_window_class,
    micro_sync,
    overrun,
    scheduler_ahead,
    short_window,
    step_without_backward,
)
from accumguard.runtime._guard_errors import (
    GuardNote,
    Violation,
    note_finding,
    violation_finding,
)
from accumguard.runtime._guard_messages import RULES, Rule

__all__ = ["ILLEGAL", "RULES", "EngineReset", "Event", "GuardMachine", "Phase", "Rule"]

log = logging.getLogger("accumguard")


class Phase(enum.Enum):
    """Where the loop is in the current window.

    ``OPEN``: no backward yet. ``ACCUMULATING``: some, fewer than the window
    size. ``FULL``: all of them; only now may unscale, clip and step happen.
    ``STEPPED``: the optimizer stepped (or the GradScaler skipped the step);
    scheduler, scaler update and zero_grad belong here; the next backward
    opens the next window.
    """

    OPEN = "open"
    ACCUMULATING = "accumulating"
    FULL = "full"
    STEPPED = "stepped"

    # Members are singletons: hash by identity (Enum's own __hash__ is a Python call,
    # run on every ILLEGAL lookup, i.e. at every backward and step).
    __hash__ = object.__hash__


class EngineReset(TypedDict):
    """What the guard says about a DeepSpeed boundary reset (F2): the ZeRO stage and the
    config's ``gradient_accumulation_steps``."""

    stage: int | None
    ds_ga: int | None


class ShortStep(NamedTuple):
    """A step before its window was complete, judged once what follows it is known
    (:func:`accumguard.observe._shared_rules.short_window`): the window, the micro-step of
    its last backward, its backward passes and size, whether it was the run's first, and
    (set at the next backward) whether a new DataLoader pass began."""

    window: int
    j: int | None
    backwards: int
    size: int
    first: bool
    ends_pass: bool | None


class Event(enum.Enum):
    BACKWARD = "backward"
    STEP = "step"
    CLIP = "clip"
    UNSCALE = "unscale"

    __hash__ = object.__hash__  # see Phase


# Which event is illegal in which phase (an absent pair is legal); notes for harmless ones.
# What ``watch`` judges too is decided by :mod:`accumguard.observe._shared_rules` (a backward
# past the window: ``overrun``; a step inside it: ``early_step``; a clip or unscale by its
# place: ``clip_verdict``); the phase is what those functions read, and this table says the
# same for documentation and for the transitions only the guard judges.
ILLEGAL: dict[tuple[Phase, Event], str] = {
    (Phase.FULL, Event.BACKWARD): "overrun",
    (Phase.OPEN, Event.STEP): "step_no_backward",
    (Phase.ACCUMULATING, Event.STEP): "step_inside",
    (Phase.STEPPED, Event.STEP): "second_step",
    (Phase.ACCUMULATING, Event.CLIP): "clip_inside",
    (Phase.OPEN, Event.CLIP): "note_clip_outside",
    (Phase.STEPPED, Event.CLIP): "note_clip_outside",
    (Phase.ACCUMULATING, Event.UNSCALE): "unscale_inside",
    (Phase.OPEN, Event.UNSCALE): "note_unscale_outside",
    (Phase.STEPPED, Event.UNSCALE): "note_unscale_outside",
}
# (phase-only transitions: a step with no backward in the window, a second step)
_STEP_BY_PHASE = {Phase.OPEN: "step_no_backward", Phase.STEPPED: "second_step"}


class GuardMachine:
    """The window state and its rules; :meth:`report` raises (``mode="raise"``) or warns."""

    def __init__(self, *, accumulation_steps: int, mode: str, sync: str,
                 total_micro_batches: int | None, history: int, rank: int | None,
                 has_scheduler: bool = False) -> None:
        self.accumulation_steps = accumulation_steps
        self._has_scheduler = has_scheduler
        self.mode = mode
        self.sync = sync
        self.total_micro_batches = total_micro_batches
        self._rank = rank
        self.phase = Phase.OPEN
        self.window = 0
        self._backwards = 0
        # (backwards, DeepSpeed's K) of an engine.step() in this window that did not step
        self._gated: tuple[int, int] | None = None
        self._consumed = 0  # micro-steps of closed windows
        self._declared: int | None = None
        self._window_steps = self._window_sched = self._window_zero = self._window_zero_in = 0
        self._window_syncs: list[bool | None] = []  # per backward: all-reduced? (None: no DDP)
        self._window_forwards: list[int] = []  # per backward: the model's forwards before it
        self._cleared = True
        self._unscaled = False
        self._zero_at: int | None = None  # backward passes done at the first zero_grad inside
        self._flip_at: int | None = None  # micro-step whose sync flag was switched off late
        self._sched_offset: int | None = None  # 1: scheduler stepped before the optimizer
        # windows shorter than K, judged by what follows (short_window); DataLoader passes
        self._short: ShortStep | None = None
        self._passes_seen = False  # a DataLoader pass began during the run
        self._pass_at: int | None = None  # backward count of this window when a pass began
        self._began_on_grad = False  # the run's first window began on a gradient in .grad
        # a clip/unscale inside the window, judged at the next event: followed by a step it
        # is part of stepping every micro-step (F1, said at the step); by a backward, F8
        self._pending: tuple[str, int | None] | None = None
        # audit trail
        self.backward_passes = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self.scheduler_steps = 0
        self.sync_rounds = 0
        self.windows_closed = 0
        self.windows: deque[StepRecord] = deque(maxlen=history)
        self.violations: list[Violation] = []
        self.notes: list[GuardNote] = []
        self._warned: set[str] = set()

    # -- declarations ---------------------------------------------------------------------
    def expect_window(self, size: int) -> None:
        """Declare the size of the current (or, right after a step, the next) window:
        a short final window of ``size`` < K micro-steps is then legal."""
        from accumguard.core.boundary import check_accumulation_steps

        check_accumulation_steps(size, "size")
        if size > self.accumulation_steps:
            raise ConfigError(f"expect_window({size}): a window holds at most "
                              f"accumulation_steps={self.accumulation_steps} micro-steps")
        done = 0 if self.phase is Phase.STEPPED else self._backwards
        if size < done:
            raise UsageError(f"expect_window({size}) but window {self.window} already ran {done} "
                             "backward passes; declare the size before its first micro-step")
        if self.phase is Phase.STEPPED:
            self._open_next_window(check_leak=None)
        self._declared = size
        if self._backwards >= size and self.phase is Phase.ACCUMULATING:
            self.phase = Phase.FULL

    def window_size(self) -> int:
        """Backward passes the current window must hold before its optimizer step."""
        if self._declared is not None:
            return self._declared
        if self.total_micro_batches is not None:
            left = self.total_micro_batches - self._consumed
            if 0 < left < self.accumulation_steps:
                return left
        return self.accumulation_steps

    # -- transitions ----------------------------------------------------------------------
    def backward(self, *, sync_forward: bool | None = None, sync_backward: bool | None = None,
                 ddp: bool = False, engine_reset: EngineReset | None = None,
                 grads_set: Callable[[], bool] | None = None, forwards: int = 0,
                 new_pass: bool = False) -> None:
        """A backward pass of the model begins (``grads_set()``: are gradients non-zero;
        ``forwards``: the model's forwards since the previous backward; ``new_pass``: a new
        pass over a DataLoader began since the previous backward)."""
        if self._pending is not None:  # (tested here: this runs at every backward)
            self._flush_pending()
        if self.phase is Phase.STEPPED:
            self._open_next_window(check_leak=grads_set)
        elif (self.phase is Phase.OPEN and self.window == 0 and not self._backwards
              and grads_set is not None):
            self._began_on_grad = grads_set()  # a resumed run's restored partial window?
        size = self.window_size()
        j = self._backwards
        if new_pass:
            self._passes_seen = True
            if j:
                self._pass_at = self._pass_at if self._pass_at is not None else j
        if j == 0 and self._short is not None and self._short.window == self.window - 1:
            # the step before ended a pass's last window, or a short one inside the run
            self._short = self._short._replace(
                ends_pass=True if new_pass else (False if self._passes_seen else None))
        if self.total_micro_batches is not None and self._consumed + j >= self.total_micro_batches:
            self.report("beyond_total", j, seen_total=self._consumed + j + 1,
                        total=self.total_micro_batches)
        elif overrun(j, size):  # the rule watch folds over a window's length
            # (a window that crossed into a new pass: the previous pass's leftover leaked)
            if long_window_class(self._pass_at is not None) == "F7":
                at = self._pass_at or 0
                self.report("leak_pass", j, next=j + 1, at=at + 1, left=at)
            elif self._gated is not None:  # K backwards, an engine.step() that did not step,
                since, ga = self._gated      # and more backwards: a K-loop around the engine's K
                self.report("double_gating", j - 1, since=since, ds_ga=ga)
            else:
                self.report("overrun", j, next=j + 1)
        if engine_reset is not None and j < size - 1:
            self.report("engine_reset", j, next=j + 1, **engine_reset)
        if ddp:
            self._check_sync(j, size, sync_forward, sync_backward)
        else:
            self._window_syncs.append(None)
        self._window_forwards.append(forwards)
        self._backwards += 1
        self.backward_passes += 1
        if self.phase is not Phase.FULL:
            self.phase = Phase.FULL if self._backwards >= size else Phase.ACCUMULATING

    def forward(self, sync: bool | None) -> None:
        """A forward of the (DDP) model with its gradient-sync flag."""
        flip, self._flip_at = self._flip_at, None
        if flip is None or self.phase is not Phase.ACCUMULATING:
            return
        if sync is False:
            self.report("flag_after_forward", flip)
        else:
            self.note("note_no_sync_backward_only", flip)

    def _check_sync(self, j: int, size: int, fwd: bool | None, bwd: bool | None) -> None:
        decided = fwd if fwd is not None else bwd
        self._window_syncs.append(decided)
        if decided:
            self.sync_rounds += 1
        if fwd is True and bwd is False:
            self._flip_at = j
        verdict = micro_sync(decided, last=j == size - 1)  # the rule watch folds over a window
        if verdict == "unsynced_last":
            flip = (f" but {bwd} at backward: a flag set after the forward does nothing "
                    "for this backward" if bwd is not None and bwd != fwd else "")
            self.report("no_sync_last", j, fwd=fwd, flip=flip)
        elif verdict == "extra" and self.sync == "deferred" and not (fwd is True and bwd is False):
            self.note("note_extra_sync", j)
        elif verdict == "deferred" and self.sync == "eager":
            self.note("note_missing_sync", j)

    def step(self, *, conservation: Conservation | None = None, unverified: str | None = None,
             deepspeed: bool = False, applied: bool = True, sharded: bool = False,
             moved: bool | None = None) -> None:
        """The model's optimizer is about to step.

        ``conservation``: the observation layer's verdict on what the step receives;
        ``unverified``: why there is none (when zero_grad ran inside the window);
        ``applied`` False: every gradient is None, a no-op for torch optimizers: ignored
        inside a window (FSDP2 defers its reduction), a lost window after its last
        backward or after a zero_grad inside it; ignored after a step too (no backward
        since it: nothing to apply). ``moved``: with no backward since the previous step,
        will this step change the parameters (a gradient left in ``.grad``)? None: unknown.
        """
        j = self._backwards - 1 if self._backwards else None
        if not applied and (self.phase in (Phase.OPEN, Phase.STEPPED)
                            or (self.phase is Phase.ACCUMULATING and self._zero_at is None)):
            return
        size = self.window_size()
        continued = continues_saved_window(
            self._backwards, size, first=self.window == 0 and self.phase is Phase.ACCUMULATING,
            stale=self._began_on_grad or (conservation is not None
                                          and conservation.reason == "stale"))
        if self.phase is Phase.ACCUMULATING:
            self._pending = None  # the step inside the window (F1) is the cause
            # the rule watch folds over the run's windows (one backward after the window's
            # forwards is the losses summed before one backward: the large batch)
            if early_step(self._backwards, size, self._window_forwards) and not continued:
                self._short_step(j, size)
            else:
                self._resolve_short(self._backwards)
        elif self.phase is Phase.FULL:
            self._resolve_short(self._backwards)
        elif (self.phase in _STEP_BY_PHASE and (self.optimizer_steps or self.window)
              and step_without_backward(moved) is not None):
            # (the run's first step with no backward: nothing stepped before it to repeat)
            self.report(_STEP_BY_PHASE[self.phase], j)
        if continued:
            conservation = None  # the gradient before the first backward is the saved one
        if not applied and (conservation is None or conservation.ok):
            if self._zero_at is not None:
                self.report("zero_grad_wiped", self._zero_at - 1, zn=self._zero_at, wiped=1.0)
            else:
                self.report("nothing_received_sync" if sharded else "nothing_received", j)
        elif conservation is not None and not conservation.ok:
            # watch's class; F2/F3 (a clear, not a zero_grad) raises the guard's F3 error
            zero_at = self._zero_at
            cls = conservation_class(conservation.reason, zero_grad_inside=zero_at is not None)
            if cls == "F7":
                self.report("stale", 0, stale=conservation.stale)
            elif grew(conservation.reason, conservation.lost, conservation.added,
                      zero_grad_inside=zero_at is not None, engine_reset=deepspeed):
                # grew, nothing removed: a term added per micro-step, right if divided by K
                wipe = conservation.first_wipe or 1
                self.note("note_grad_grew", wipe, wipe=wipe + 1)
            elif cls == "F3" and zero_at is not None:
                self.report("zero_grad_wiped", zero_at - 1, zn=zero_at, wiped=conservation.wiped)
            else:
                wipe = conservation.first_wipe or 1
                self.report("grad_wiped", wipe, wipe=wipe + 1, wiped=conservation.wiped)
        elif conservation is None and self._zero_at is not None and unverified:
            self.note("note_zero_unverified", self._zero_at - 1, zn=self._zero_at,
                      why=unverified)
        self._check_scheduler_before_step(j)
        self.phase = Phase.STEPPED
        self._flip_at = None
        self._window_steps += 1
        self.optimizer_steps += 1
        self._cleared = deepspeed  # DeepSpeed clears its gradients at the end of its step

    def _short_step(self, j: int | None, size: int) -> None:
        """A step after fewer backward passes than the window holds, judged when the next
        window closes (:meth:`_resolve_short`; the previous short window first, now that
        this one closed): only what follows tells an epoch's last window or the run's last
        (right) from a boundary off by one (F13) or a step per micro-step (F1). In raise
        mode the error stops the next step, before it runs."""
        self._resolve_short(self._backwards)
        self._short = ShortStep(self.window, j, self._backwards, size, self.window == 0, None)

    def _resolve_short(self, nxt: int | None) -> None:
        """Judge the pending short window now that the next window closed after ``nxt``
        backward passes (None: the run ended after it); reported at the short window."""
        p, self._short = self._short, None
        if p is None:
            return
        verdict = short_window(p.backwards, p.size, first=p.first, nxt=nxt, last=nxt is None,
                               ends_pass=p.ends_pass)
        if verdict == "F1":
            self.report("step_inside", p.j, at_window=p.window, n=p.backwards, size=p.size)
        elif verdict == "F13":
            self.report("short_first" if p.first else "short_inside_pass", p.j,
                        at_window=p.window, n=p.backwards, size=p.size, nxt=nxt)
        elif verdict == "unsure":
            self.note("note_short_window", p.j, at_window=p.window, n=p.backwards,
                      size=p.size)

    def skipped_step(self) -> None:
        """GradScaler skipped optimizer.step (inf/nan): the window still ended."""
        if self.phase is Phase.FULL:
            self._resolve_short(self._backwards)
            self.phase = Phase.STEPPED
            self.skipped_steps += 1
            self._cleared = False

    def zero_grad(self) -> None:
        self._flush_pending()
        if self.phase in (Phase.ACCUMULATING, Phase.FULL):
            self._window_zero_in += 1
            self._zero_at = self._backwards if self._zero_at is None else self._zero_at
        self._window_zero += 1
        self._cleared = True

    def scheduler_step(self) -> None:
        steps = self.optimizer_steps + self.skipped_steps
        self.scheduler_steps += 1
        self._window_sched += 1
        if self._sched_offset is None:
            self._sched_offset = max(0, min(1, self.scheduler_steps - steps))
        if scheduler_ahead(self.scheduler_steps, steps, allowance=self._sched_offset):
            j = self._backwards - 1 if self._backwards else None
            key = "sched_second" if self.phase is Phase.STEPPED else "sched_extra"
            self.report(key, j, sched=self.scheduler_steps, steps=steps)

    def _check_scheduler_before_step(self, j: int | None) -> None:
        if self._has_scheduler:
            steps = self.optimizer_steps + self.skipped_steps
            if self.scheduler_steps < steps + (self._sched_offset or 0):
                self.report("sched_missing", j, sched=self.scheduler_steps, steps=steps)
                self.scheduler_steps = steps + (self._sched_offset or 0)  # report once

    def _clip_place(self) -> str | None:
        """:func:`clip_verdict` on this moment: after a step the next window has no
        backward yet, so a clip there acts on none of its gradient."""
        done = 0 if self.phase is Phase.STEPPED else self._backwards
        return clip_verdict(done, self.window_size())

    def clip(self, *, scaler_enabled: bool) -> None:
        j = self._backwards - 1 if self._backwards else None
        place = self._clip_place()
        if place == "inside":
            self._pending = self._pending or ("clip_inside", j)
        elif place == "outside":
            self.note("note_clip_outside", j)
        elif scaler_enabled and not self._unscaled:
            self.report("clip_before_unscale", j)

    def unscale(self) -> None:
        j = self._backwards - 1 if self._backwards else None
        place = self._clip_place()
        if place == "inside":
            self._pending = self._pending or ("unscale_inside", j)
        elif place == "outside":
            self.note("note_unscale_outside", j)
        self._unscaled = True

    def desync(self, sums: str) -> None:
        j = self._backwards - 1 if self._backwards else None
        self.report("desync", j, sums=sums, steps=self.optimizer_steps + 1)

    def double_gating(self, *, since: int, ds_ga: int) -> None:
        self.report("double_gating", self._backwards - 1, since=since, ds_ga=ds_ga)

    def gated_without_step(self, *, since: int, ds_ga: int) -> None:
        """An ``engine.step()`` that did not step after ``since`` > 1 backwards: double gating
        if the window goes on past K (the engine's K backwards, then K step() calls, is
        its own accumulation)."""
        self._gated = (since, ds_ga)

    # -- windows ----------------------------------------------------------------------------
    def _open_next_window(self, *, check_leak: Callable[[], bool] | None) -> None:
        """Close the stepped window (check that gradients were cleared), open the next."""
        self._close_record()
        if not self._cleared and check_leak is not None and check_leak():
            self.report("leak", None)
        self._consumed += self._backwards
        self.window += 1
        self._backwards = 0
        self._gated = None
        self._declared = None
        self._window_steps = self._window_sched = self._window_zero = self._window_zero_in = 0
        self._window_syncs = []
        self._window_forwards = []
        self._pass_at = None
        self._cleared = True
        self._unscaled = False
        self._zero_at = None
        self._flip_at = None
        self.phase = Phase.OPEN

    def _close_record(self) -> None:
        self.windows_closed += 1
        self.windows.append(StepRecord(
            step=self.window, backwards=self._backwards, sync_micros=self._window_syncs,
            optimizer_steps=self._window_steps, scheduler_steps=self._window_sched,
            zero_grads=self._window_zero_in, zero_grad_calls=self._window_zero))

    def _flush_pending(self) -> None:
        """Report a clip/unscale seen inside the window now that no step followed it (the
        raise still comes before any update: no optimizer step has run since)."""
        if self._pending is not None:
            key, j = self._pending
            self._pending = None
            self.report(key, j)

    def final_checks(self) -> None:
        self._flush_pending()
        self._resolve_short(None)  # the run's last window: a final partial window
        if self.phase in (Phase.ACCUMULATING, Phase.FULL):
            self.report("unfinished", self._backwards - 1)
        elif self.phase is Phase.STEPPED:
            self._close_record()
            self.phase = Phase.OPEN
        steps = self.optimizer_steps + self.skipped_steps
        if self._has_scheduler and self.scheduler_steps < steps:
            self.report("sched_missing", None, sched=self.scheduler_steps, steps=steps)

    # -- reporting ----------------------------------------------------------------------------
    def _context(self, **extra: object) -> dict[str, object]:
        ctx: dict[str, object] = {"n": self._backwards, "size": self.window_size(),
                                  "k": self.accumulation_steps, "phase": self.phase.value}
        ctx.update(extra)
        return ctx

    def _where(self, micro_step: int | None, window: int) -> str:
        return f"window {window}" + ("" if micro_step is None else f", micro-step {micro_step}")

    def report(self, key: str, micro_step: int | None, *, at_window: int | None = None,
               **extra: object) -> None:
        """Record the violation ``key`` at ``micro_step`` (of ``at_window``, default the
        current window); raise it or warn once per class."""
        rule = RULES[key]
        if rule.error is None:
            self.note(key, micro_step, at_window=at_window, **extra)
            return
        cls = rule.error
        window = self.window if at_window is None else at_window
        ctx = self._context(j=micro_step, **extra)
        seen, expected = rule.seen.format(**ctx), rule.expected.format(**ctx)
        fix = rule.fix.format(**ctx) if rule.fix else fix_for(cls.rule).rstrip(".")
        message = (f"{rank_prefix(self._rank)}[{cls.rule} {cls.title}] "
                   f"{self._where(micro_step, window)}: "
                   f"saw {seen}; expected {expected}. Fix: {fix}.")
        finding = violation_finding(cls, rank=self._rank, window=window,
                                    micro_step=micro_step, seen=seen, expected=expected, fix=fix)
        self.violations.append(Violation(rule=cls.rule, error=cls.__name__, window=window,
                                         micro_step=micro_step, message=message,
                                         finding=finding))
        if self.mode == "raise":
            raise cls(message, window=window, micro_step=micro_step, seen=seen,
                      expected=expected, finding=finding)
        if cls.__name__ not in self._warned:
            self._warned.add(cls.__name__)
            log.warning("accumguard guard: %s", message)
            warnings.warn(message, AccumguardWarning, stacklevel=4)

    def note(self, key: str, micro_step: int | None, *, at_window: int | None = None,
             **extra: object) -> None:
        """A correct but wasteful (or unverifiable) pattern: recorded, warned once per kind."""
        rule = RULES[key]
        window = self.window if at_window is None else at_window
        ctx = self._context(j=micro_step, **extra)
        seen, expected = rule.seen.format(**ctx), rule.expected.format(**ctx)
        fix = rule.fix.format(**ctx)
        message = (f"{rank_prefix(self._rank)}[note] {self._where(micro_step, window)}: saw "
                   f"{seen}; expected {expected}. {fix}.")
        finding = note_finding(key, rank=self._rank, window=window, micro_step=micro_step,
                               seen=seen, expected=expected, fix=fix)
        self.notes.append(GuardNote(kind=key, window=window, micro_step=micro_step,
                                    message=message, finding=finding))
        if key not in self._warned:
            self._warned.add(key)
            log.info("accumguard guard: %s", message)
            warnings.warn(message, AccumguardWarning, stacklevel=4)

    def summary(self) -> dict[str, int]:
        """Counts so far, for logs and tests."""
        return {"windows": self.windows_closed,
                "backward_passes": self.backward_passes, "optimizer_steps": self.optimizer_steps,
                "skipped_steps": self.skipped_steps, "scheduler_steps": self.scheduler_steps,
                "sync_rounds": self.sync_rounds, "violations": len(self.violations)}
