"""Accelerate: the Accumulator driven through an ``Accelerator``, and the checks attached.

One change to an Accelerate loop: replace ``with accelerator.accumulate(model): ...
accelerator.backward(loss_mean)`` by::

    acc = accumulator(accelerator, model, optimizer, scheduler=scheduler, count_fn=count_tokens)
    for window in acc.windows(dataloader):          # the prepared dataloader
        window.run(lambda batch: summed_token_loss(model, batch))

Why: ``accelerator.backward`` divides every micro-batch's loss by
``gradient_accumulation_steps``; with a token-mean loss and uneven token counts
that is failure class F5. Here the loss is a *sum*, and the scale that makes the
optimizer receive ``Σ g_i / N`` (N over all micro-steps and ranks) is derived in
:func:`accumguard.core.scaling.loss_scale` from what Accelerate does: DDP averages
over ranks, ``backward`` divides by its own GA (declared as data by
:class:`AccelerateEngine`, not undone by hand).

The scheduler: Accelerate's prepared ``AcceleratedScheduler`` steps its inner
scheduler ``num_processes`` times per optimizer step when ``split_batches=False``
(it assumes a schedule sized in single-process batches). The fp64 large-batch
reference steps the schedule once per optimizer step, so by default
(``scheduler_steps="one"``) the Accumulator steps the *inner* scheduler once;
``scheduler_steps="accelerate"`` keeps Accelerate's convention (logged).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from accumguard.accumulate.accumulator import Accumulator
from accumguard.core.errors import ConfigError
from accumguard.core.scaling import GradReduction
from accumguard.engines.base import Engine, Scheduler
from accumguard.integrations._checks import (
    DEFAULT_EVERY_N_STEPS,
    AccumulationChecks,
    unwrap_scheduler,
)

__all__ = ["AccelerateEngine", "accumulator", "watch"]

log = logging.getLogger("accumguard")


class Accelerator(Protocol):
    """What this adapter uses of ``accelerate.Accelerator`` (accelerate ships no type
    information; this names the attributes and calls it depends on)."""

    sync_gradients: bool
    gradient_accumulation_steps: int
    num_processes: int

    def no_sync(self, model: torch.nn.Module) -> AbstractContextManager[None]: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def clip_grad_norm_(self, parameters: Iterable[torch.nn.Parameter],
                        max_norm: float) -> torch.Tensor: ...


class AccelerateEngine(Engine):
    """Adapter for a model prepared by an ``accelerate.Accelerator`` (plain or DDP).

    Micro-steps 1..K-1 run under ``accelerator.no_sync(model)`` (spanning the
    forward) with Accelerate's ``sync_gradients`` off, so the prepared optimizer
    does not step; the last one syncs. ``backward`` is ``accelerator.backward``,
    whose division by ``gradient_accumulation_steps`` is declared in
    :meth:`reduction` and compensated by the one scaling function.
    """

    name = "accelerate"

    def __init__(self, accelerator: Accelerator, model: torch.nn.Module) -> None:
        dt = getattr(accelerator, "distributed_type", None)
        dtype = str(getattr(dt, "value", dt))
        if dtype not in ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU",
                         "MULTI_HPU", "DEEPSPEED"):
            raise ConfigError(
                f"the accelerate integration drives plain data parallelism (DDP or one process) "
                f"and DeepSpeed; this Accelerator runs {dtype}. For FSDP, use accumguard's own "
                "engines on the unwrapped model")
        super().__init__(model)
        self.accelerator = accelerator
        # DeepSpeed: accelerator.backward runs engine.backward (which divides by the engine's
        # GA, the Accelerator's after prepare) with the boundary flag set from sync_gradients,
        # and engine.step() at the boundary; ZeRO reduces (and averages over ranks) itself
        self.deepspeed = dtype == "DEEPSPEED"
        # (the engine holds the optimizer: the prepared wrapper's step/zero_grad are no-ops)
        self.owns_optimizer = self.deepspeed
        self.sync_mode = "engine" if self.deepspeed else (
            "deferred" if self.world_size > 1 else "none")
        self._previous_sync: bool | None = None

    def reduction(self) -> GradReduction:
        return GradReduction(world_size=self.world_size, averages_over_ranks=self.world_size > 1,
                             divides_by=float(self.accelerator.gradient_accumulation_steps))

    @contextlib.contextmanager
    def micro_step(self, *, is_last: bool) -> Iterator[None]:
        acc = self.accelerator
        if self._previous_sync is None:
            self._previous_sync = bool(acc.sync_gradients)
        acc.sync_gradients = is_last  # the prepared optimizer steps only when this is True
        if is_last or self.deepspeed:  # (ZeRO-2/3 refuse no_sync: the boundary flag defers)
            yield
        else:
            with acc.no_sync(self.model):
                yield

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        norm: torch.Tensor = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)
        return norm

    def abort_window(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.accelerator.sync_gradients = True  # else the prepared optimizer ignores zero_grad
        super().abort_window(optimizer)

    def close(self) -> None:
        if self._previous_sync is not None:
            self.accelerator.sync_gradients = self._previous_sync
            self._previous_sync = None


def accumulator(accelerator: Accelerator, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer, *, accumulation_steps: int | None = None,
                scheduler: Scheduler | None = None, scheduler_steps: str = "one",
                count_fn: Callable[[Any], float | torch.Tensor] | None = None,
                max_grad_norm: float | None = None, **options: Any) -> Accumulator:
    """An :class:`~accumguard.Accumulator` on Accelerate's prepared objects.

    ``accumulation_steps`` defaults to the Accelerator's ``gradient_accumulation_steps``.
    Iterate ``acc.windows(prepared_dataloader)``; the loss passed to ``backward`` is the
    **sum** over tokens (``count_fn`` counts them, e.g. ``(batch["labels"] != -100).sum()``).
    The final partial window (an epoch length not a multiple of K) steps on its own count;
    iterable datasets without a length work the same. ``options`` go to the Accumulator.
    """
    if scheduler_steps not in ("one", "accelerate"):
        raise ConfigError(f"scheduler_steps ({scheduler_steps!r}) must be 'one' (the schedule "
                          "advances once per optimizer step, like the large-batch reference) "
                          "or 'accelerate' (Accelerate's num_processes steps per optimizer "
                          "step when split_batches=False)")
    k = accumulation_steps if accumulation_steps is not None else int(
        accelerator.gradient_accumulation_steps)
    engine = AccelerateEngine(accelerator, model)
    if engine.deepspeed and k != int(accelerator.gradient_accumulation_steps):
        raise ConfigError(
            f"accumulation_steps ({k}) differs from the DeepSpeed engine's "
            f"gradient_accumulation_steps ({accelerator.gradient_accumulation_steps}): the "
            "engine divides each backward by its own value and steps at the boundary the loop "
            "sets; leave accumulation_steps unset")
    if engine.deepspeed and max_grad_norm is not None:
        raise ConfigError(
            "under DeepSpeed the engine clips in its step(), by the config's gradient_clipping; "
            "set gradient_clipping in the DeepSpeed config and leave max_grad_norm unset")
    sched = scheduler
    if scheduler is not None and scheduler_steps == "one":
        sched = unwrap_scheduler(scheduler)
    elif scheduler is not None:
        log.info("accumguard: Accelerate steps the LR schedule %d time(s) per optimizer step",
                 1 if getattr(scheduler, "split_batches", True) else accelerator.num_processes)
    return Accumulator(model, optimizer, accumulation_steps=k, engine=engine, scheduler=sched,
                       count_fn=count_fn, max_grad_norm=max_grad_norm, **options)


def watch(accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          *, scheduler: object = None, accumulation_steps: int | None = None,
          every_n_steps: int = DEFAULT_EVERY_N_STEPS, **options: Any) -> AccumulationChecks:
    """Attach the accumulation checks to Accelerate objects (any loop: yours or ours).

    Returns the :class:`~accumguard.integrations._checks.AccumulationChecks`; read
    ``.findings`` (F5 for a token mean through ``accelerator.backward`` with uneven
    counts, F8 for a clip on every micro-step, F1 for micro-steps outside
    ``accelerator.accumulate``, ...) and
    ``close()`` it at the end. One step in ``every_n_steps`` is checked (the scheduler
    count every step). ``options`` go to ``AccumulationChecks``.
    """
    k = accumulation_steps if accumulation_steps is not None else int(
        accelerator.gradient_accumulation_steps)
    options.setdefault("fix_hints", FIX_HINTS)
    return AccumulationChecks(model, optimizer, accumulation_steps=k, scheduler=scheduler,
                              every_n_steps=every_n_steps, **options)


#: The fix of each class in Accelerate's terms (appended to the generic one).
FIX_HINTS = {
    "F5": "With Accelerate: sum the token losses and step through accumulator(accelerator, "
          "...), which divides by the window's global count.",
    "LOSS_SCALE": "With Accelerate: accelerator.backward already divides by "
                  "gradient_accumulation_steps; accumulator(accelerator, ...) compensates it.",
    "F8": "With Accelerate: clip only when accelerator.sync_gradients is True.",
    "F1": "With Accelerate: run each micro-step inside `with accelerator.accumulate(model):` "
          "(or step only when accelerator.sync_gradients).",
}
