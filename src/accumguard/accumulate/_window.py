"""A window of K micro-batches, its micro-steps, and what its boundary did.

The objects the user iterates; every state change is delegated to the
:class:`~accumguard.accumulate.accumulator.Accumulator` that built them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import torch

from accumguard.accumulate._config import AccumulationConfig
from accumguard.core.errors import UsageError
from accumguard.core.scaling import GradReduction, loss_scale
from accumguard.engines import Engine


class Driver(Protocol):
    """What a Window and its MicroSteps use of the Accumulator that built them (a protocol,
    so that this module does not import the Accumulator, which imports it)."""

    config: AccumulationConfig
    engine: Engine

    def _enter(self, micro: MicroStep) -> None: ...

    def _backward(self, micro: MicroStep, loss: torch.Tensor,
                  count: float | torch.Tensor | None) -> None: ...

    def _exit(self, micro: MicroStep, failed: bool) -> None: ...


@dataclass(frozen=True)
class StepResult:
    """What happened at one boundary; passed to ``on_boundary`` callbacks.

    ``loss`` is this rank's share of the window's normalised loss (the sum over
    ranks is the loss of the full effective batch). ``count`` is N, over all
    micro-steps and ranks. ``lrs`` are the learning rates the step used.
    ``skipped``: no optimizer step was taken for this window (and the scheduler
    did not advance); ``skip_reason`` says why (non-finite values, an overflow
    the GradScaler or DeepSpeed skipped, an empty window, an exception).
    """

    step: int
    window: int
    micro_steps: int
    count: float
    loss: torch.Tensor | None
    grad_norm: torch.Tensor | None
    lrs: tuple[float, ...]
    skipped: bool = False
    skip_reason: str | None = None


class MicroStep:
    """One micro-batch of a window; a context manager that forward and backward run in."""

    def __init__(self, window: Window, index: int, batch: Any, count: float) -> None:
        self.window = window
        self.index = index
        self.batch = batch
        self.count = count
        self.is_last = index == len(window) - 1
        self._did_backward = False
        self._ctx: AbstractContextManager[None] | None = None  # the engine's micro_step

    def __enter__(self) -> MicroStep:
        self.window.acc._enter(self)
        return self

    def backward(self, loss: torch.Tensor, count: float | int | torch.Tensor | None = None) -> None:
        """Backpropagate this micro-step's loss (a sum over samples in ``"sum"`` mode).

        ``count``, if given, must equal what ``count_fn`` reported for this batch:
        it is a cross-check, since N had to be known before the first backward.
        """
        self.window.acc._backward(self, loss, count)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.window.acc._exit(self, failed=exc_type is not None)


class Window:
    """The K (or fewer, at the end of data) micro-batches of one optimizer step."""

    def __init__(self, acc: Driver, index: int, batches: list[Any], counts: list[float],
                 global_count: float) -> None:
        self.acc = acc
        self.index = index
        self.batches = batches
        self.counts = counts
        self.global_count = global_count
        self.skipped = global_count == 0
        self.is_partial = len(batches) < acc.config.accumulation_steps
        self.result: StepResult | None = None
        self.aborted = False
        self._entered = 0
        # First micro-step whose loss was NaN/Inf on this rank (-1: none); a device tensor,
        # so watching for it costs no host sync per micro-step.
        self._bad_micro: torch.Tensor | None = None
        # Tensor counts passed to backward(), checked against count_fn at the boundary.
        self._count_checks: list[tuple[int, torch.Tensor]] = []
        # The factors of this window, derived once: what each micro-step's loss is multiplied
        # by before backward, and the same for an engine that does nothing (this rank's share
        # of the window loss, for StepResult.loss).
        self._grad_scale = self._loss_share = 0.0
        if not self.skipped:
            mode, engine = acc.config.normalization, acc.engine
            self._grad_scale = loss_scale(mode=mode, reduction=engine.reduction(),
                                          global_count=global_count, window_micro_steps=len(self))
            self._loss_share = loss_scale(
                mode=mode, reduction=GradReduction(world_size=engine.world_size),
                global_count=global_count, window_micro_steps=len(self))

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[MicroStep]:
        if self.skipped:
            return
        for i, (batch, count) in enumerate(zip(self.batches, self.counts, strict=True)):
            yield MicroStep(self, i, batch, count)

    def run(self, loss_fn: Callable[[Any], Any]) -> StepResult:
        """Run every micro-step with ``loss_fn(batch)`` returning a loss or ``(loss, count)``."""
        for micro in self:
            with micro:
                out = loss_fn(micro.batch)
                if isinstance(out, tuple):
                    micro.backward(*out)
                else:
                    micro.backward(out)
        if self.result is None:
            raise UsageError(f"window {self.index} did not finish; run() must be called on the "
                             "current window, once")
        return self.result
