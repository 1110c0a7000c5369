"""The observer's own health: an internal error switches observation off, never the run.

Everything accumguard puts into a user's process runs through one of two doors, and both
are here:

* a **patch** (:meth:`Failsafe.patch`): a wrapper around a library function (``backward``,
  ``zero_grad``, a collective, a loss function...). The wrapper's own work before and after
  the wrapped call is guarded; the wrapped call itself runs exactly once, with the user's
  arguments, and whatever it raises reaches the user unchanged. If the wrapper's work fails
  before the call, the call is made as if accumguard were absent; if it fails after, the
  call's result is returned.
* a **hook** (:meth:`Failsafe.hook`): a function torch calls back (module forward hooks,
  autograd node pre-hooks, optimizer step hooks). A failing hook returns ``None``, which
  tells torch "change nothing".

The first internal error is kept as a :class:`Failure` (where, what, the traceback, the
step), reported once on stderr and to the listeners' ``on_internal_error``, and every door
becomes a plain pass-through; the patches are undone at the next point where no patched
call is running on this thread. Only accumguard's deliberate errors (an
:class:`~accumguard.core.errors.AccumulationError` raised by the guard to stop an illegal
action) and ``BaseException``\\ s that are not ``Exception`` (``KeyboardInterrupt``,
``SystemExit``) go through.

Fault injection for the tests: ``ACCUMGUARD_TEST_FAULT=<label>[:pre|:post][@N]`` makes the
N-th call (default 1) of every door whose label contains ``<label>`` raise
:class:`InjectedFault`, before the wrapped call (``pre``, the default) or after it
(``post``; for a hook, inside it). Labels are ``Owner.attr`` for patches (``Tensor.backward``,
``Optimizer.zero_grad``, ``functional.cross_entropy``) and ``hook:<name>`` for hooks.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from accumguard.core.errors import AccumulationError

__all__ = ["ENV_FAULT", "Failsafe", "Failure", "InjectedFault", "hook_method"]

ENV_FAULT = "ACCUMGUARD_TEST_FAULT"

F = TypeVar("F", bound=Callable[..., object])
R = TypeVar("R")

#: a library function a patch wraps, and the wrapper made of it: called with whatever its
#: caller passed, its result handed back unchanged (opaque to the door)
Original = Callable[..., object]
#: a patch's body: builds the observing wrapper of an original
Maker = Callable[[Original], Original]


class InjectedFault(RuntimeError):
    """Raised inside accumguard by ``ACCUMGUARD_TEST_FAULT`` (tests only)."""


@dataclass(frozen=True)
class Failure:
    """accumguard's own failure on this process: observation is off from here on."""

    where: str  # the door's label: "Tensor.backward", "hook:_opt_pre", "install", ...
    error: str  # "IndexError: ..."
    traceback: str
    step: int | None  # optimizer steps recorded before it (None: unknown)

    def as_dict(self) -> dict[str, str | int | None]:
        return {"where": self.where, "error": self.error, "traceback": self.traceback,
                "step": self.step}

    def line(self) -> str:
        at = "" if self.step is None else f" after {self.step} optimizer step(s)"
        return f"internal error in {self.where}{at}: {self.error}"


class _Call:
    """One patched call in flight: did the wrapped function run, return, or raise?

    No ``__init__``: the door makes one per patched call (about 20 per optimizer step
    under ``watch``), and a Python constructor is a frame each time; the flags start from
    these class defaults and the door sets ``args``/``kwargs``."""

    called = False
    done = False
    result: object = None
    raised: BaseException | None = None
    args: tuple[object, ...]
    kwargs: dict[str, object]


class _Fault:
    def __init__(self, spec: str) -> None:
        spec, _, nth = spec.partition("@")
        label, _, when = spec.rpartition(":")
        if when not in ("pre", "post"):  # "hook:_opt_pre": the colon is the label's own
            label, when = spec, "pre"
        self.label, self.when = label, when
        self.nth = int(nth) if nth.strip().isdigit() else 1
        self.seen = 0

    def hit(self, label: str, when: str) -> bool:
        if when != self.when or self.label not in label:
            return False
        self.seen += 1
        return self.seen == self.nth


class Failsafe:
    """The doors through which accumguard's code runs inside a user's process.

    Args:
        name: who is observing, for the stderr line ("accumguard watch", "the guard").
        step: reads the optimizer steps recorded so far, for the failure record.
    """

    def __init__(self, name: str = "accumguard", step: Callable[[], int] | None = None) -> None:
        self.name = name
        self.failure: Failure | None = None
        self.ok = True
        # observation ended on purpose (:meth:`retire`): the doors pass through, and the
        # first one entered with no patched call running tears the patches down
        self.retired = False
        self._retire_pending = False
        self._step = step
        self._on_fail: list[Callable[[Failure], None]] = []
        self._teardown: list[Callable[[], None]] = []
        self._local = threading.local()
        spec = os.environ.get(ENV_FAULT, "")
        self._fault: _Fault | None = _Fault(spec) if spec else None

    # -- what happens on a failure -----------------------------------------------------------
    def on_failure(self, fn: Callable[[Failure], None]) -> None:
        """Call ``fn(failure)`` once when observation fails (its own errors are ignored)."""
        self._on_fail.append(fn)

    def on_teardown(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once after a failure, when no patched call runs on this thread
        (removing patches and hooks from inside a backward is not safe)."""
        self._teardown.append(fn)

    def fail(self, where: str, exc: BaseException) -> None:
        """Record accumguard's own failure and switch every door to pass-through."""
        if not self.ok:
            return
        self.ok = False
        step = None
        if self._step is not None:
            try:
                step = int(self._step())
            except Exception:  # noqa: BLE001 - the record must not fail
                step = None
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.failure = Failure(where=where, error=f"{type(exc).__name__}: {exc}",
                               traceback=tb, step=step)
        with contextlib.suppress(Exception):  # stderr may be closed
            print(f"{self.name}: {self.failure.line()}; observation is off on this process "
                  "from here on, the run continues unchanged and was not checked after "
                  "this point (please report this with the traceback in the recording)",
                  file=sys.stderr)
        for fn in self._on_fail:
            with contextlib.suppress(Exception):  # reporting the failure must not fail
                fn(self.failure)
        if not getattr(self._local, "stack", None):
            self._tear_down()

    def retire(self) -> None:
        """End observation on purpose (not a failure): every door passes through from now
        on, and the patches and hooks are removed at the next patched call entered with no
        other one running on this thread (not here: this may run inside torch's loop over
        its optimizer hooks, which must not change under it)."""
        if not self.ok:
            return
        self.ok = False
        self.retired = True
        self._retire_pending = True

    def _tear_down(self) -> None:
        actions, self._teardown = self._teardown, []
        for fn in actions:
            with contextlib.suppress(Exception):  # best effort: the doors pass through
                fn()

    def guard(self, where: str, fn: Callable[..., R], *args: object, **kwargs: object) -> R | None:
        """Run one piece of accumguard's work (install, a callback body); on an internal
        error record it and return None."""
        if not self.ok:
            return None
        try:
            return fn(*args, **kwargs)
        except AccumulationError:
            raise
        except Exception as exc:  # noqa: BLE001 - the whole point
            self.fail(where, exc)
            return None

    # -- the two doors -----------------------------------------------------------------------
    def hook(self, fn: F, label: str | None = None) -> F:
        """``fn`` as a torch hook that never raises an internal error into the caller."""
        where = "hook:" + (label or str(getattr(fn, "__name__", "hook")))

        def hook(*args: object, **kwargs: object) -> object:
            # the door is written out here and in hook_method (no shared helper): a hook
            # runs per forward/backward/step, and a helper's frame was a third of its cost
            if not self.ok:
                return None
            try:
                if self._fault is not None and (self._fault.hit(where, "pre")
                                                or self._fault.hit(where, "post")):
                    raise InjectedFault(f"injected fault in {where}")
                return fn(*args, **kwargs)
            except AccumulationError:
                raise
            except Exception as exc:  # noqa: BLE001 - never into user code
                self.fail(where, exc)
                return None

        return hook  # type: ignore[return-value]

    def patch(self, label: str, make: Maker, orig: Original) -> Original:
        """``make(orig)``, the observing wrapper, behind the patch door (see the module)."""
        local = self._local

        def tracked(*args: object, **kwargs: object) -> object:
            stack = getattr(local, "stack", None)
            call = stack[-1] if stack else None
            if call is None or call.called:  # not our call's first run: plain
                return orig(*args, **kwargs)
            call.called = True
            try:
                out = orig(*args, **kwargs)
            except BaseException as exc:
                call.raised = exc
                raise
            call.done, call.result = True, out
            if self._fault is not None and self._fault.hit(label, "post"):
                raise InjectedFault(f"injected fault in {label} (after the call)")
            return out

        wrapper = make(tracked)
        # a wrapper that would only call straight through right now (a backward nested in
        # one already observed, a window the loss record skips) says so: the door's own
        # bookkeeping is then skipped too (it is only there for the wrapper's code)
        passes: Callable[[], bool] | None = getattr(wrapper, "passes", None)

        def door(*args: object, **kwargs: object) -> object:
            if not self.ok:
                if self._retire_pending and not getattr(local, "stack", None) \
                        and not _in_backward():
                    self._retire_pending = False
                    self._tear_down()
                return orig(*args, **kwargs)
            if passes is not None:
                try:
                    through = passes()
                except Exception as exc:  # noqa: BLE001 - never into user code
                    self.fail(label, exc)
                    return orig(*args, **kwargs)
                if through:
                    return orig(*args, **kwargs)
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            call = _Call()
            call.args, call.kwargs = args, kwargs
            stack.append(call)
            internal: BaseException | None = None
            try:
                if self._fault is not None and self._fault.hit(label, "pre"):
                    raise InjectedFault(f"injected fault in {label}")
                return wrapper(*args, **kwargs)
            except AccumulationError:
                raise
            except Exception as exc:  # noqa: BLE001 - sorted out below
                if call.raised is not None and exc is call.raised:
                    raise  # the user's own error, untouched
                internal = exc
            finally:
                stack.pop()
                if not self.ok and not stack:
                    self._tear_down()
            # accumguard failed (outside the except block: the user's exception, if any,
            # must not be chained to ours)
            self.fail(label, internal)
            if not stack:
                self._tear_down()
            if call.raised is not None:
                raise call.raised
            if call.done:
                return call.result
            if call.called:  # the wrapped call ran (and did not raise): never run it twice
                return call.result
            return orig(*call.args, **call.kwargs)

        return door

    def set_args(self, *args: object, **kwargs: object) -> None:
        """A wrapper that consumed the caller's arguments (a generator of parameters) hands
        their materialised form here, for the pass-through call after a failure."""
        stack = getattr(self._local, "stack", None)
        if stack:
            stack[-1].args, stack[-1].kwargs = args, kwargs


def _in_backward() -> bool:
    """A backward pass is running on this thread (a hook's collective): hooks are not
    removed from inside it."""
    import torch  # (imported by then: a door only runs in a process that uses torch)

    return torch._C._current_autograd_node() is not None


class _HasFailsafe(Protocol):
    failsafe: Failsafe


def hook_method(fn: F) -> F:
    """A method torch calls back as a hook, behind its owner's ``failsafe`` door."""
    where = "hook:" + fn.__name__

    @functools.wraps(fn)
    def hook(self: _HasFailsafe, *args: object, **kwargs: object) -> object:
        # Failsafe.hook's door, written out (one frame less per call; same semantics)
        door = self.failsafe
        if not door.ok:
            return None
        try:
            fault = door._fault
            if fault is not None and (fault.hit(where, "pre") or fault.hit(where, "post")):
                raise InjectedFault(f"injected fault in {where}")
            return fn(self, *args, **kwargs)
        except AccumulationError:
            raise
        except Exception as exc:  # noqa: BLE001 - never into user code
            door.fail(where, exc)
            return None

    return hook  # type: ignore[return-value]
