"""The learning rate as the optimizers hold it, read at every backward pass of a window.

A schedule computed by hand (nanoGPT's ``get_lr(it)`` written into ``param_groups``) is
invisible to the scheduler rule: no scheduler object steps. What shows it is the value
itself: a schedule indexed by the optimizer step sets one learning rate per window; one
indexed by the micro-step changes it between the backward passes of a window (judged by
:mod:`._lr_rules`). Reading a few Python floats per backward costs nothing measurable; a
learning rate held as a tensor (capturable optimizers) is not read (reading it could copy
from the device and synchronise it).
"""

from __future__ import annotations

import weakref
from typing import Protocol

__all__ = ["LrTrace"]


class _HasGroups(Protocol):
    param_groups: list[dict[str, object]]


def _lrs(opt: _HasGroups) -> tuple[float, ...]:
    out: list[float] = []
    for g in opt.param_groups:
        lr = g.get("lr")
        if isinstance(lr, (int, float)) and not isinstance(lr, bool):
            out.append(float(lr))
    return tuple(out)


class LrTrace:
    """The optimizers seen stepping, and how often their learning rates changed between two
    backward passes of the current window."""

    def __init__(self) -> None:
        self._opts: dict[int, weakref.ref[_HasGroups]] = {}
        self._last: tuple[float, ...] | None = None
        self._changes = 0
        self._at_step: tuple[float, ...] | None = None  # the rates when the step began
        self.closures = False  # a backward ran inside an optimizer step (its closure)

    def know(self, opt: object) -> None:
        """Trace ``opt`` from now on (called at its steps: a window's first backward before
        any step is not traced)."""
        if id(opt) in self._opts or not isinstance(getattr(opt, "param_groups", None), list):
            return
        try:
            self._opts[id(opt)] = weakref.ref(opt)  # type: ignore[arg-type]
        except TypeError:  # an object without weak references: not traced
            return

    def at_step_start(self) -> None:
        """An optimizer step begins, in a run whose steps run backwards in their closure
        (Lightning's last micro-step): the rates it starts with, since a write made for this
        step comes before the closure's backward. (Only such runs pay for this read.)"""
        now: list[float] = []
        for ref in list(self._opts.values()):
            opt = ref()
            if opt is not None:
                now.extend(_lrs(opt))
        self._at_step = tuple(now)

    def at_backward(self, in_step: int = 0) -> None:
        """One backward pass: compare the learning rates with those at the previous one.
        ``in_step``: the backward runs inside an optimizer step (its closure): rates written
        before the step began (an ``optimizer_step`` override's warm-up) are the step's, not
        a change between backward passes (the first such backward of the run is given the
        benefit of the doubt: the rates at its step's start were not read)."""
        if not self._opts:
            return
        # _lrs inlined: this runs at every backward (the same floats, no call per optimizer)
        now: list[float] = []
        for ref in list(self._opts.values()):
            opt = ref()
            if opt is not None:
                for g in opt.param_groups:
                    lr = g.get("lr")
                    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
                        now.append(float(lr))
        cur = tuple(now)
        if in_step and not self.closures:
            self.closures = True
        elif self._last is not None and cur != self._last \
                and not (in_step and cur == self._at_step):
            self._changes += 1
        self._last = cur

    def take(self) -> tuple[int, float | None]:
        """At the step: (learning-rate changes between the window's backward passes, the
        first traced group's learning rate), and a new window (a change between the last
        backward and the next window's first is the schedule's normal once-per-step move)."""
        first: float | None = None
        for ref in self._opts.values():
            opt = ref()
            if opt is not None:
                lrs = _lrs(opt)
                if lrs:
                    first = lrs[0]
                    break
        changes, self._changes, self._last = self._changes, 0, None
        return changes, first
