"""The guard's message table: one :class:`Rule` per illegal transition and per note (split
from :mod:`._guard_machine`, which holds the transitions that use it; each key there names
its message here).

Each rule's text is formatted with the machine's context (``n``, ``size``, ``k``, ``j``
and what the caller adds); an empty ``fix`` takes the taxonomy's fix for the class.
"""

from __future__ import annotations

from dataclasses import dataclass

from accumguard.runtime._guard_errors import (
    ClipInsideWindowError,
    DoubleGatingError,
    EngineBoundaryResetError,
    ExtraStepError,
    GradientDesyncError,
    GradientLeakError,
    GradientSyncError,
    GuardViolation,
    SchedulerStepError,
    ShortWindowError,
    StepInsideWindowError,
    WindowOverrunError,
    ZeroGradInsideWindowError,
)

__all__ = ["RULES", "Rule"]


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
    "leak_pass": Rule(GradientLeakError,
                      "backward pass {next} in a window of {size} without an optimizer step, "
                      "after a new pass over the DataLoader began at backward pass {at}: the "
                      "{left} micro-step(s) left at the end of the previous pass were not "
                      "stepped and joined this pass's window",
                      "an optimizer step (or an explicit drop) at the end of every pass",
                      "step on each epoch's last partial window too (normalised by its own "
                      "count), or zero_grad() before the next epoch to drop it on purpose; "
                      "a counter restarted each epoch without that leaks the leftover"),
    "step_no_backward": Rule(ExtraStepError,
                             "optimizer.step() with no backward pass since the previous step, "
                             "with gradients still set (they are applied a second time)",
                             "one optimizer.step() per window, after its last backward",
                             "step once per window, after its last backward"),
    "step_inside": Rule(StepInsideWindowError,
                        "optimizer.step() after {n} of {size} backward passes",
                        "one optimizer.step() after backward pass {size}", _STEP_FIX),
    "second_step": Rule(ExtraStepError, "a second optimizer.step() in the window, with "
                        "gradients still set (they are applied a second time)",
                        "exactly one optimizer.step() per window",
                        "step once per window, after its last backward"),
    "short_first": Rule(ShortWindowError,
                        "the first optimizer.step() after {n} of {size} backward passes, the "
                        "next after {nxt}",
                        "the first optimizer.step() after backward pass {size}",
                        "count the boundary from the right origin: step when "
                        "(micro_step + 1) % {k} == 0 with micro_step from 0 (`i % K == 0` "
                        "with i from 0 steps after the first micro-batch); a resumed run "
                        "must restore the saved partial window's gradient with its counter"),
    "short_inside_pass": Rule(ShortWindowError,
                              "optimizer.step() after {n} of {size} backward passes in the "
                              "middle of a pass over the DataLoader (not its last window)",
                              "one optimizer.step() after backward pass {size}; a shorter "
                              "window only at the end of a pass or of the run",
                              "derive the boundary from (micro_step + 1) % {k} with a counter "
                              "reset only at a boundary (and at each epoch's start, after "
                              "stepping on the epoch's partial window)"),
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
    "note_short_window": Rule(None, "optimizer.step() after {n} of {size} backward passes, "
                              "in a run that reads no DataLoader",
                              "one optimizer.step() after backward pass {size}, or a shorter "
                              "window at an epoch's end",
                              "fine at an epoch's end when the window is normalised by its own "
                              "count; otherwise the boundary is off (F13): step when "
                              "(micro_step + 1) % {k} == 0"),
    "note_grad_grew": Rule(None, "the gradient grew before backward pass {wipe} of {size} by "
                           "something other than a backward (nothing was removed, no "
                           "zero_grad ran): a term added to .grad on every micro-step",
                           "a per-update term added once per window, or divided by {size}",
                           "add it after the window's last backward (right before "
                           "optimizer.step()), or divide what each micro-step adds by K"),
    "note_zero_unverified": Rule(None, "zero_grad() after {zn} of {size} backward passes; "
                                 "whether the removed gradient reached the optimizer was not "
                                 "checked ({why})", "zero_grad() only after optimizer.step()",
                                 "if the gradient is not moved to a buffer and put back before "
                                 "the step, this is F3"),
}
