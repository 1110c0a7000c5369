"""The guard's state machine: phases of a window, the illegal transitions, one message each.

A window is the run of backward passes that one optimizer step consumes. Its phase
(:class:`Phase`) moves ``OPEN -> ACCUMULATING -> FULL -> STEPPED`` and back to ``OPEN``
at the next window's first backward. :data:`ILLEGAL` lists which event is illegal in
which phase; :data:`RULES` holds the one message of every violation (and of every note:
a correct but wasteful or unverifiable pattern, reported and never raised). The
machine knows nothing of hooks: :class:`accumguard.runtime.guard.AccumulationGuard`
feeds it the observation layer's events that concern its model and optimizer.

Size (~550 lines): more than half of it is :data:`RULES`, the message table; it stays
next to the transitions that use it so that each illegal transition and its one message
are read together.

Checks that need the numbers (did the gradient removed inside the window reach the
optimizer? did ranks agree?) are verdicts computed by :mod:`accumguard.observe` and
passed in with the step; the machine only decides what they mean.
"""

from __future__ import annotations

import enum
import logging
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

from accumguard.core.errors import AccumguardWarning, ConfigError, UsageError, rank_prefix
from accumguard.core.taxonomy import fix_for
from accumguard.core.window import StepRecord
from accumguard.observe._shared_rules import conservation_class, micro_sync, scheduler_ahead
from accumguard.runtime._guard_errors import (
    ClipInsideWindowError,
    DoubleGatingError,
    EngineBoundaryResetError,
    ExtraStepError,
    GradientDesyncError,
    GradientLeakError,
    GradientSyncError,
    GuardNote,
    GuardViolation,
    SchedulerStepError,
    StepInsideWindowError,
    Violation,
    WindowOverrunError,
    ZeroGradInsideWindowError,
    violation_finding,
)

__all__ = ["ILLEGAL", "RULES", "Event", "GuardMachine", "Phase", "Rule"]

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


class Event(enum.Enum):
    BACKWARD = "backward"
    STEP = "step"
    CLIP = "clip"
    UNSCALE = "unscale"

    __hash__ = object.__hash__  # see Phase


@dataclass(frozen=True)
class Rule:
    """One illegal transition (``error`` set) or one note (``error`` None): the message
    parts, formatted with the machine's context (``n``, ``size``, ``k`` ...)."""

    error: type[GuardViolation] | None
    seen: str
    expected: str
    fix: str = ""  # empty: the taxonomy's fix for the error's class


_STEP_FIX = ("step only when (micro_step + 1) % {k} == 0 (and after the final short window); "
             "or use accumguard.Accumulator. A short final window must be declared: "
             "guard.expect_window(n) or total_micro_batches=")

RULES: dict[str, Rule] = {
    # -- phase transitions (see ILLEGAL) -------------------------------------------------
    "overrun": Rule(WindowOverrunError,
                    "backward pass {next} in a window of {size} without an optimizer step",
                    "optimizer.step() after backward pass {size}",
                    "step when (micro_step + 1) % {k} == 0; an accumulation counter that is off "
                    "by one (often after resume or at an epoch boundary) makes windows of K+1"),
    "step_no_backward": Rule(ExtraStepError,
                             "optimizer.step() with no backward pass in the window",
                             "optimizer.step() after {size} backward passes",
                             "step once per window, after its last backward"),
    "step_inside": Rule(StepInsideWindowError,
                        "optimizer.step() after {n} of {size} backward passes",
                        "one optimizer.step() after backward pass {size}", _STEP_FIX),
    "second_step": Rule(ExtraStepError, "a second optimizer.step() in the window",
                        "exactly one optimizer.step() per window",
                        "step once per window, after its last backward"),
    "clip_inside": Rule(ClipInsideWindowError,
                        "clip_grad_norm_() after {n} of {size} backward passes",
                        "clipping once, after the window's last backward and before the step",
                        "clip the accumulated (and synchronised) gradient once per window; "
                        "clipping each micro-step shrinks every micro-batch's gradient "
                        "separately"),
    "unscale_inside": Rule(ClipInsideWindowError,
                           "scaler.unscale_() after {n} of {size} backward passes",
                           "unscale_ once, after the window's last backward",
                           "unscale once per window, right before clipping and the step"),
    # -- numbers and counts --------------------------------------------------------------
    "clip_before_unscale": Rule(ClipInsideWindowError,
                                "clip_grad_norm_() before scaler.unscale_()",
                                "scaler.unscale_(optimizer) before clipping",
                                "call scaler.unscale_(optimizer) right before clip_grad_norm_: "
                                "clipping scaled gradients compares the norm with a threshold "
                                "scale times too small"),
    "zero_grad_wiped": Rule(ZeroGradInsideWindowError,
                            "zero_grad() after {zn} of {size} backward passes, before the "
                            "optimizer step ({wiped:.3g} of the window's gradient was removed "
                            "and never reached the optimizer)",
                            "zero_grad() only after optimizer.step() (or before the window's "
                            "first backward)",
                            "move zero_grad() next to optimizer.step(); clearing between "
                            "micro-steps keeps only the last micro-batches' gradient"),
    "grad_wiped": Rule(ZeroGradInsideWindowError,
                       "gradients were cleared (set to None) before backward pass {wipe} "
                       "({wiped:.3g} of the window's gradient was removed and never reached "
                       "the optimizer)", "gradients kept for the whole window",
                       "clear gradients only after optimizer.step(); a zero_grad (or "
                       "p.grad = None) between micro-steps keeps only the last micro-batches' "
                       "gradient. Moving .grad into your own buffer is fine when the full sum "
                       "is back in .grad before the step"),
    "nothing_received": Rule(ZeroGradInsideWindowError,
                             "optimizer.step() after {n} of {size} backward passes with every "
                             "gradient None: nothing the window contributed reached it",
                             "the window's accumulated gradient in .grad at the step",
                             "clear gradients only after optimizer.step()"),
    "nothing_received_sync": Rule(GradientSyncError,
                                  "optimizer.step() after {n} of {size} backward passes with "
                                  "every gradient None: the last micro-step did not reduce "
                                  "(FSDP2 set_requires_gradient_sync(False) still in effect)",
                                  "the reduced gradient in .grad at the step",
                                  "call model.set_requires_gradient_sync(True) before the "
                                  "window's last forward/backward"),
    "stale": Rule(GradientLeakError,
                  "gradient left from before the window (relative size {stale:.3g}) reached "
                  "the optimizer", "gradients cleared between windows",
                  "call optimizer.zero_grad() after optimizer.step(); otherwise this "
                  "window's gradient is added to the next one"),
    "leak": Rule(GradientLeakError,
                 "gradients still set when the next window started (no zero_grad after the "
                 "optimizer step)", "gradients cleared between windows",
                 "call optimizer.zero_grad() after optimizer.step(); otherwise this window's "
                 "gradient is added to the next one"),
    "unfinished": Rule(GradientLeakError,
                       "the guard closed with {n} of {size} backward passes and no optimizer "
                       "step", "every window ends with an optimizer step",
                       "step on the final short window too (declare it with "
                       "guard.expect_window(n) or total_micro_batches=), or drop it on purpose "
                       "before its first backward"),
    "beyond_total": Rule(WindowOverrunError, "backward pass number {seen_total} of this rank",
                         "at most total_micro_batches={total}",
                         "the loop runs more micro-batches than declared; pass the right "
                         "total_micro_batches (micro-batches per rank) or fix the data loader"),
    "sched_extra": Rule(SchedulerStepError,
                        "scheduler.step() after {n} of {size} backward passes: {sched} "
                        "scheduler steps for {steps} optimizer step(s)",
                        "one scheduler.step() per optimizer.step()",
                        "step the scheduler next to optimizer.step(), once per window: stepped "
                        "per micro-step the learning rate runs K times ahead of its schedule"),
    "sched_second": Rule(SchedulerStepError,
                         "a second scheduler.step() for one optimizer step ({sched} scheduler "
                         "steps for {steps} optimizer step(s))",
                         "exactly one scheduler.step() per optimizer step",
                         "step the scheduler once per window"),
    "sched_missing": Rule(SchedulerStepError,
                          "{sched} scheduler.step() calls for {steps} optimizer step(s)",
                          "exactly one scheduler.step() per optimizer step",
                          "call scheduler.step() once after each optimizer.step(); pass "
                          "scheduler= to the guard only for a per-optimizer-step scheduler"),
    "no_sync_last": Rule(GradientSyncError,
                         "no gradient all-reduce on the window's last micro-step "
                         "(require_backward_grad_sync={fwd} at its forward{flip})",
                         "one all-reduce on the last micro-step",
                         "run the last micro-step's forward and backward outside "
                         "model.no_sync(); otherwise the optimizer steps on this rank's "
                         "unsynchronised gradient"),
    "flag_after_forward": Rule(GradientSyncError,
                               "require_backward_grad_sync=True at forward but False at "
                               "backward, and still False at the next forward: the flag is "
                               "set after the forward, so the window's last forward will run "
                               "without sync",
                               "the flag set before the forward (DDP decides at forward time)",
                               "enter model.no_sync() (or set require_backward_grad_sync) "
                               "*before* the forward and keep it until after backward"),
    "desync": Rule(GradientDesyncError,
                   "gradient |sum| differs across ranks at optimizer step {steps} ({sums})",
                   "identical synchronised gradients on every rank",
                   "make the window's last micro-step all-reduce (its forward and backward "
                   "outside no_sync); a sync flag set after forward leaves ranks apart"),
    "engine_reset": Rule(EngineBoundaryResetError,
                         "backward pass {next} of {size} ran at a DeepSpeed ZeRO-{stage} "
                         "accumulation boundary (gradient_accumulation_steps={ds_ga}, outside "
                         "coalesce_grad_reduction): the engine resets its gradient partition "
                         "there", "the engine's boundary only at the window's last backward"),
    "double_gating": Rule(DoubleGatingError,
                          "engine.step() after {since} backward passes but DeepSpeed did not "
                          "step (its gradient_accumulation_steps={ds_ga} counts engine.step() "
                          "calls, one per micro-batch)",
                          "one engine.backward() and one engine.step() per micro-batch"),
    # -- notes: correct but wasteful, or not verifiable ----------------------------------
    "note_extra_sync": Rule(None, "a gradient all-reduce on non-final micro-step {j} of {size}",
                            "no collective before the last micro-step (sync='deferred')",
                            "wasteful, one extra all-reduce (the gradient is unchanged): run "
                            "forward *and* backward of micro-steps 0..K-2 inside "
                            "model.no_sync(), or pass sync='eager'"),
    "note_no_sync_backward_only": Rule(None, "no_sync() entered after the forward (it spans "
                                       "only the backward): DDP had already decided at the "
                                       "forward to all-reduce",
                                       "no_sync() around forward and backward",
                                       "wasteful, one extra all-reduce per micro-step (the "
                                       "gradient is unchanged): move the forward inside "
                                       "model.no_sync()"),
    "note_missing_sync": Rule(None, "no all-reduce on non-final micro-step {j} of {size}",
                              "an all-reduce on every micro-step (sync='eager')",
                              "the gradient is unchanged: pass sync='deferred' if no_sync on "
                              "non-final micro-steps is intended"),
    "note_clip_outside": Rule(None, "clip_grad_norm_() with the window {phase} (it has no "
                              "effect on the next optimizer step)",
                              "clipping after the window's last backward, before the step",
                              "clip between the last backward and optimizer.step()"),
    "note_unscale_outside": Rule(None, "scaler.unscale_() with the window {phase}",
                                 "unscale_ after the window's last backward",
                                 "unscale right before clipping and the step"),
    "note_zero_unverified": Rule(None, "zero_grad() after {zn} of {size} backward passes; "
                                 "whether the removed gradient reached the optimizer was not "
                                 "checked ({why})", "zero_grad() only after optimizer.step()",
                                 "if the gradient is not moved to a buffer and put back before "
                                 "the step, this is F3"),
}

# Which event is illegal in which phase (an absent pair is legal); notes for harmless ones.
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
        self._consumed = 0  # micro-steps of closed windows
        self._declared: int | None = None
        self._window_steps = self._window_sched = self._window_zero = self._window_zero_in = 0
        self._window_syncs: list[bool | None] = []  # per backward: all-reduced? (None: no DDP)
        self._cleared = True
        self._unscaled = False
        self._zero_at: int | None = None  # backward passes done at the first zero_grad inside
        self._flip_at: int | None = None  # micro-step whose sync flag was switched off late
        self._sched_offset: int | None = None  # 1: scheduler stepped before the optimizer
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
                 ddp: bool = False, engine_reset: dict[str, Any] | None = None,
                 grads_set: Any = None) -> None:
        """A backward pass of the model begins (``grads_set()``: are gradients non-zero)."""
        self._flush_pending()
        if self.phase is Phase.STEPPED:
            self._open_next_window(check_leak=grads_set)
        size = self.window_size()
        j = self._backwards
        if self.total_micro_batches is not None and self._consumed + j >= self.total_micro_batches:
            self.report("beyond_total", j, seen_total=self._consumed + j + 1,
                        total=self.total_micro_batches)
        elif (self.phase, Event.BACKWARD) in ILLEGAL:
            self.report(ILLEGAL[self.phase, Event.BACKWARD], j, next=j + 1)
        if engine_reset is not None and j < size - 1:
            self.report("engine_reset", j, next=j + 1, **engine_reset)
        if ddp:
            self._check_sync(j, size, sync_forward, sync_backward)
        else:
            self._window_syncs.append(None)
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

    def step(self, *, conservation: Any = None, unverified: str | None = None,
             deepspeed: bool = False, applied: bool = True, sharded: bool = False) -> None:
        """The model's optimizer is about to step.

        ``conservation``: the observation layer's verdict on what the step receives;
        ``unverified``: why there is none (when zero_grad ran inside the window);
        ``applied`` False: every gradient is None, a no-op for torch optimizers: ignored
        inside a window (FSDP2 defers its reduction), a lost window after its last
        backward or after a zero_grad inside it."""
        j = self._backwards - 1 if self._backwards else None
        if not applied and (self.phase is Phase.OPEN or (self.phase is Phase.ACCUMULATING
                                                         and self._zero_at is None)):
            return
        if self.phase is Phase.ACCUMULATING:
            self._pending = None  # the step inside the window (F1) is the cause
        if (self.phase, Event.STEP) in ILLEGAL:
            self.report(ILLEGAL[self.phase, Event.STEP], j)
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

    def skipped_step(self) -> None:
        """GradScaler skipped optimizer.step (inf/nan): the window still ended."""
        if self.phase is Phase.FULL:
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

    def clip(self, *, scaler_enabled: bool) -> None:
        j = self._backwards - 1 if self._backwards else None
        key = ILLEGAL.get((self.phase, Event.CLIP))
        if key == "clip_inside":
            self._pending = self._pending or (key, j)
        elif key is not None:
            self.report(key, j)
        elif scaler_enabled and not self._unscaled:
            self.report("clip_before_unscale", j)

    def unscale(self) -> None:
        key = ILLEGAL.get((self.phase, Event.UNSCALE))
        if key == "unscale_inside":
            self._pending = self._pending or (key, self._backwards - 1 if self._backwards
                                              else None)
        elif key is not None:
            self.report(key, self._backwards - 1 if self._backwards else None)
        self._unscaled = True

    def desync(self, sums: str) -> None:
        j = self._backwards - 1 if self._backwards else None
        self.report("desync", j, sums=sums, steps=self.optimizer_steps + 1)

    def double_gating(self, *, since: int, ds_ga: int) -> None:
        self.report("double_gating", self._backwards - 1, since=since, ds_ga=ds_ga)

    # -- windows ----------------------------------------------------------------------------
    def _open_next_window(self, *, check_leak: Any) -> None:
        """Close the stepped window (check that gradients were cleared), open the next."""
        self._close_record()
        if not self._cleared and check_leak is not None and check_leak():
            self.report("leak", None)
        self._consumed += self._backwards
        self.window += 1
        self._backwards = 0
        self._declared = None
        self._window_steps = self._window_sched = self._window_zero = self._window_zero_in = 0
        self._window_syncs = []
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
        if self.phase in (Phase.ACCUMULATING, Phase.FULL):
            self.report("unfinished", self._backwards - 1)
        elif self.phase is Phase.STEPPED:
            self._close_record()
            self.phase = Phase.OPEN
        steps = self.optimizer_steps + self.skipped_steps
        if self._has_scheduler and self.scheduler_steps < steps:
            self.report("sched_missing", None, sched=self.scheduler_steps, steps=steps)

    # -- reporting ----------------------------------------------------------------------------
    def _context(self, **extra: Any) -> dict[str, Any]:
        ctx = {"n": self._backwards, "size": self.window_size(), "k": self.accumulation_steps,
               "phase": self.phase.value}
        ctx.update(extra)
        return ctx

    def _where(self, micro_step: int | None) -> str:
        return f"window {self.window}" + ("" if micro_step is None
                                          else f", micro-step {micro_step}")

    def report(self, key: str, micro_step: int | None, **extra: Any) -> None:
        """Record the violation ``key`` at ``micro_step``; raise it or warn once per class."""
        rule = RULES[key]
        if rule.error is None:
            self.note(key, micro_step, **extra)
            return
        cls = rule.error
        ctx = self._context(j=micro_step, **extra)
        seen, expected = rule.seen.format(**ctx), rule.expected.format(**ctx)
        fix = rule.fix.format(**ctx) if rule.fix else fix_for(cls.rule).rstrip(".")
        message = (f"{rank_prefix(self._rank)}[{cls.rule} {cls.title}] {self._where(micro_step)}: "
                   f"saw {seen}; expected {expected}. Fix: {fix}.")
        finding = violation_finding(cls, rank=self._rank, window=self.window,
                                    micro_step=micro_step, seen=seen, expected=expected, fix=fix)
        self.violations.append(Violation(rule=cls.rule, error=cls.__name__, window=self.window,
                                         micro_step=micro_step, message=message,
                                         finding=finding))
        if self.mode == "raise":
            raise cls(message, window=self.window, micro_step=micro_step, seen=seen,
                      expected=expected, finding=finding)
        if cls.__name__ not in self._warned:
            self._warned.add(cls.__name__)
            log.warning("accumguard guard: %s", message)
            warnings.warn(message, AccumguardWarning, stacklevel=4)

    def note(self, key: str, micro_step: int | None, **extra: Any) -> None:
        """A correct but wasteful (or unverifiable) pattern: recorded, warned once per kind."""
        rule = RULES[key]
        ctx = self._context(j=micro_step, **extra)
        message = (f"{rank_prefix(self._rank)}[note] {self._where(micro_step)}: saw "
                   f"{rule.seen.format(**ctx)}; expected {rule.expected.format(**ctx)}. "
                   f"{rule.fix.format(**ctx)}.")
        self.notes.append(GuardNote(kind=key, window=self.window, micro_step=micro_step,
                                    message=message))
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
