"""What the runtime guard reports: its violation classes and its records (a closed window
is the one window record, :class:`accumguard.core.window.StepRecord`).

Every violation names its failure class (the id of :mod:`accumguard.core.taxonomy`)
in ``rule``; ``title`` is the illegal transition in a few words; ``finding`` is the same
violation as the one :class:`~accumguard.core.findings.Finding` every check of accumguard
reports (error level; step and micro-step 1-based, unlike ``window``/``micro_step``)::

    AccumulationError
    └── GuardViolation                 rule, window, micro_step, seen, expected
        ├── StepInsideWindowError      F1  optimizer.step() after one backward, window after window
        ├── ExtraStepError             EXTRA_STEP  a step with no backward since the previous one,
        │                                  applying a gradient again
        ├── EngineBoundaryResetError   F2  DeepSpeed ZeRO-1/2 reset its gradients mid-window
        ├── ZeroGradInsideWindowError  F3  gradient removed inside the window never reached the step
        ├── SchedulerStepError         F4  scheduler steps != optimizer steps
        ├── GradientLeakError          F7  gradients not cleared between windows / window unfinished
        ├── ClipInsideWindowError      F8  clip or unscale before the window's last backward
        ├── GradientSyncError          F11 the window's last micro-step did not all-reduce
        ├── GradientDesyncError        F11 post-sync gradients differ across ranks
        ├── WindowOverrunError         F13 more backward passes than the window holds
        ├── ShortWindowError           F13 a step before the window is complete, not at the end
        │                                  of a pass over the data nor of the run
        └── DoubleGatingError          F14 DeepSpeed accumulates K and the loop loops K
"""

from __future__ import annotations

from dataclasses import dataclass

from accumguard.core.errors import AccumulationError
from accumguard.core.findings import Finding, Severity

__all__ = [
    "ClipInsideWindowError", "DoubleGatingError", "EngineBoundaryResetError", "ExtraStepError",
    "GradientDesyncError", "GradientLeakError", "GradientSyncError", "GuardNote",
    "GuardViolation", "SchedulerStepError", "ShortWindowError", "StepInsideWindowError",
    "Violation",
    "NOTE_CLASSES", "WindowOverrunError", "ZeroGradInsideWindowError", "note_finding",
    "violation_finding",
]


class GuardViolation(AccumulationError):
    """The runtime guard saw the accumulation contract broken.

    ``rule`` is the failure-class id (``"F1"`` ...), ``window`` and ``micro_step``
    (0-based) say where, ``seen``/``expected`` what; ``finding`` is the violation as a
    :class:`~accumguard.core.findings.Finding` (None when raised by hand without one).
    """

    rule = "F?"
    title = "accumulation contract"

    def __init__(self, message: str, *, window: int, micro_step: int | None, seen: str,
                 expected: str, finding: Finding | None = None) -> None:
        super().__init__(message)
        self.window = window
        self.micro_step = micro_step
        self.seen = seen
        self.expected = expected
        self.finding = finding


def violation_finding(error: type[GuardViolation], *, rank: int | None, window: int,
                      micro_step: int | None, seen: str, expected: str, fix: str) -> Finding:
    """The guard's violation as the one finding type: its class and transition title, at
    error level (the guard raises or warns only on a broken contract), optimizer step
    ``window + 1`` and micro-step ``micro_step + 1`` (the guard counts both from 0, a
    finding from 1), what it saw against what the contract expects, and the fix."""
    return Finding(error.rule, Severity.ERROR, rank, window + 1,
                   None if micro_step is None else micro_step + 1,
                   f"saw {seen}; expected {expected}", f"{fix.rstrip('.')}.", error.title)


class StepInsideWindowError(GuardViolation):
    rule, title = "F1", "optimizer step inside the window"


class ExtraStepError(GuardViolation):
    rule, title = "EXTRA_STEP", "optimizer step with no backward pass since the previous step"


class EngineBoundaryResetError(GuardViolation):
    rule, title = "F2", "engine accumulation boundary inside the window"


class ZeroGradInsideWindowError(GuardViolation):
    rule, title = "F3", "zero_grad inside the window"


class SchedulerStepError(GuardViolation):
    rule, title = "F4", "LR-scheduler steps differ from optimizer steps"


class GradientLeakError(GuardViolation):
    rule, title = "F7", "gradient leaks across windows"


class ClipInsideWindowError(GuardViolation):
    rule, title = "F8", "clip/unscale not at the boundary"


class GradientSyncError(GuardViolation):
    rule, title = "F11", "gradient synchronisation on the wrong micro-step"


class GradientDesyncError(GuardViolation):
    rule, title = "F11", "post-sync gradients differ across ranks"


class WindowOverrunError(GuardViolation):
    rule, title = "F13", "window longer than accumulation_steps"


class ShortWindowError(GuardViolation):
    rule, title = "F13", "window shorter than accumulation_steps inside the run"


class DoubleGatingError(GuardViolation):
    rule, title = "F14", "double gating of the accumulation boundary"


@dataclass(frozen=True)
class Violation:
    """One observed violation (kept in :attr:`AccumulationGuard.violations`, in both modes)."""

    rule: str
    error: str
    window: int
    micro_step: int | None
    message: str
    #: the violation as the one finding type (see :func:`violation_finding`)
    finding: Finding | None = None


@dataclass(frozen=True)
class GuardNote:
    """A correct but wasteful (or unverifiable) pattern: reported, never raised.

    ``kind`` is the guard's rule key (``"note_extra_sync"`` ...); ``finding`` the same note
    as the one :class:`~accumguard.core.findings.Finding` (see :func:`note_finding`)."""

    kind: str
    window: int
    micro_step: int | None
    message: str
    finding: Finding | None = None


#: Each note's class and severity as a finding: what ``watch`` names the same pattern
#: (EXTRA_SYNC for a wasteful all-reduce), F8 at note level for a clip that acts on none of
#: the next step's gradient, F3 at warning level for a zero_grad inside the window whose
#: effect was not measured (wrong unless the gradient was moved away and put back), OK for
#: a deferred sync where ``sync="eager"`` was declared (the gradient is unchanged).
NOTE_CLASSES: dict[str, tuple[str, Severity, str]] = {
    "note_extra_sync": ("EXTRA_SYNC", Severity.NOTE,
                        "gradient all-reduce on a non-final micro-step (extra communication)"),
    "note_no_sync_backward_only": ("EXTRA_SYNC", Severity.NOTE,
                                   "no_sync() entered after the forward (extra all-reduce)"),
    "note_missing_sync": ("OK", Severity.NOTE,
                          "no all-reduce on a non-final micro-step where sync='eager' was "
                          "declared (gradient unchanged)"),
    "note_clip_outside": ("F8", Severity.NOTE,
                          "clipping outside the window (no effect on the next step)"),
    "note_unscale_outside": ("F8", Severity.NOTE,
                             "GradScaler unscale outside the window (no effect on the next "
                             "step)"),
    "note_short_window": ("F13", Severity.NOTE,
                          "optimizer step before the window is complete, in a run that reads "
                          "no DataLoader (an epoch's last window, or a boundary off by one)"),
    "note_grad_grew": ("LOSS_SCALE", Severity.WARNING,
                       "a term added to the gradient between backward passes (counts K times "
                       "unless divided by K)"),
    "note_zero_unverified": ("F3", Severity.WARNING,
                             "zero_grad inside the window, not verified"),
}


def note_finding(kind: str, *, rank: int | None, window: int, micro_step: int | None,
                 seen: str, expected: str, fix: str) -> Finding:
    """The guard's note as the one finding type (numbered from 1, as
    :func:`violation_finding`): class, severity and title from :data:`NOTE_CLASSES`, what
    was seen against what was expected, and the note's advice as the fix."""
    cls, severity, title = NOTE_CLASSES.get(kind, ("OK", Severity.NOTE, kind))
    return Finding(cls, severity, rank, window + 1, None if micro_step is None else micro_step + 1,
                   f"saw {seen}; expected {expected}", f"{fix.rstrip('.')}.", title)
