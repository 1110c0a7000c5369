"""The accumulation boundary as a tiny, framework-free state machine.

Gradient accumulation is correct only if the work that belongs to an optimizer
step (gradient reduction, clipping, ``optimizer.step``, ``zero_grad``, ...)
happens exactly once per window of K micro-steps, at the window's last
micro-step, and the count starts again from zero afterwards. :class:`Boundary`
is that rule and nothing else: it knows no torch, so any backend can be driven
with two callbacks, as in::

    boundary = Boundary(accumulation_steps=4, reducer=all_reduce_grads, stepper=opt.step)
    for batch in loader:
        loss_fn(batch).backward()
        boundary.micro_step()          # calls reducer() and stepper() on every 4th call
    boundary.flush()                   # a short final window still gets its step
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from accumguard.core.errors import ConfigError

__all__ = ["Boundary", "check_accumulation_steps"]


def check_accumulation_steps(value: object, name: str = "accumulation_steps") -> int:
    """Return ``value`` if it is a positive int, else raise a :class:`ConfigError` that says why."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"`{name}` ({value!r}, a {type(value).__name__}) must be a positive int; pass the "
            "number of micro-batches per optimizer step, e.g. 4"
        )
    if value <= 0:
        raise ConfigError(
            f"`{name}` ({value}) must be a positive int; pass the number of micro-batches per "
            "optimizer step (1 means no accumulation)"
        )
    return value


def _noop() -> None:
    return None


@dataclass
class Boundary:
    """Counts micro-steps in windows of ``accumulation_steps`` and fires the boundary work.

    ``reducer`` then ``stepper`` run once when a window closes: after the K-th
    micro-step, or on :meth:`flush` for a final short window. ``windows_closed``
    and ``micro_steps`` are the audit trail.
    """

    accumulation_steps: int
    reducer: Callable[[], object] = _noop
    stepper: Callable[[], object] = _noop
    count: int = field(default=0, init=False)
    windows_closed: int = field(default=0, init=False)
    micro_steps: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        check_accumulation_steps(self.accumulation_steps)

    def is_last(self, window_size: int | None = None) -> bool:
        """Whether the *next* micro-step closes the window (of ``window_size`` if it is short)."""
        size = self.accumulation_steps if window_size is None else window_size
        return self.count + 1 >= size

    def micro_step(self, window_size: int | None = None) -> bool:
        """Record one micro-step; fire the boundary if it closes the window. Returns whether it did.

        ``window_size`` (≤ K) lets a caller that knows the window is short (the
        last one of an epoch) close it at the right micro-step.
        """
        size = self.accumulation_steps if window_size is None else window_size
        if not 1 <= size <= self.accumulation_steps:
            raise ConfigError(
                f"window_size ({size}) must be between 1 and accumulation_steps "
                f"({self.accumulation_steps})"
            )
        self.count += 1
        self.micro_steps += 1
        if self.count >= size:
            self._close()
            return True
        return False

    def flush(self) -> bool:
        """Close a partial window (end of data). Returns whether there was one to close."""
        if self.count == 0:
            return False
        self._close()
        return True

    def _close(self) -> None:
        self.reducer()
        self.stepper()
        self.count = 0
        self.windows_closed += 1
