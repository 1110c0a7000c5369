"""A cheap runtime sentinel for the accumulation boundary contract.

:func:`guard` watches a training loop you already have (hand-written, the
:class:`~accumguard.Accumulator`, or anything else that drives a model and an
optimizer) and raises the moment the contract of one optimizer step per
window of K micro-steps is broken::

    with accumguard.runtime.guard(model, optimizer, accumulation_steps=4, scheduler=sched):
        for i, batch in enumerate(loader):
            last = (i + 1) % 4 == 0
            with contextlib.nullcontext() if last else model.no_sync():
                loss_fn(model, batch).backward()
            if last:
                optimizer.step(); sched.step(); optimizer.zero_grad()

How it observes, without changing any number the loop computes:

* a forward hook that reads DDP's ``require_backward_grad_sync`` (DDP decides
  at forward time whether the next backward all-reduces) and puts a pre-hook on
  the output's ``grad_fn``: the first such pre-hook of an autograd run marks
  one backward pass (``queue_callback`` marks its end);
* ``optimizer.register_step_pre_hook`` for optimizer steps;
* instance-level wrappers of ``optimizer.zero_grad``, ``model.zero_grad``,
  ``scheduler.step``, ``scaler.unscale_``/``update``, and of
  ``torch.nn.utils.clip_grad_norm_`` while the guard is installed. On exit the
  previous objects are put back exactly (also when they were wrappers
  themselves) and every hook is removed.

The guard is an explicit state machine over :class:`Phase`; each illegal
transition has one rule (the failure-class id of mission.md) and one error
class below, all subclasses of :class:`~accumguard.core.errors.AccumulationError`::

    AccumulationError
    └── GuardViolation                 rule, window, micro_step, seen, expected
        ├── StepInsideWindowError      F1  optimizer.step() before the window is complete
        ├── ExtraStepError             F1  a second step in one window / a step with no backward
        ├── ZeroGradInsideWindowError  F3  gradients cleared inside the window
        ├── SchedulerStepError         F4  scheduler steps != optimizer steps
        ├── GradientLeakError          F7  gradients not cleared between windows / window unfinished
        ├── ClipInsideWindowError      F8  clip or unscale before the window's last backward
        ├── GradientSyncError          F11 wrong gradient collectives for the micro-step
        ├── GradientDesyncError        F11 post-sync gradients differ across ranks
        └── WindowOverrunError         F13 more backward passes than the window holds
"""

from __future__ import annotations

import enum
import functools
import logging
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from accumguard.core.boundary import check_accumulation_steps
from accumguard.core.errors import (
    AccumguardWarning,
    AccumulationError,
    ConfigError,
    UsageError,
    rank_prefix,
)

__all__ = [
    "AccumulationGuard",
    "ClipInsideWindowError",
    "ExtraStepError",
    "GradientDesyncError",
    "GradientLeakError",
    "GradientSyncError",
    "GuardViolation",
    "Phase",
    "SchedulerStepError",
    "StepInsideWindowError",
    "Violation",
    "WindowOverrunError",
    "WindowRecord",
    "ZeroGradInsideWindowError",
    "guard",
]

log = logging.getLogger("accumguard")

_SYNC_MODES = ("deferred", "eager", "any")


# -- errors ---------------------------------------------------------------------------------

class GuardViolation(AccumulationError):
    """The runtime guard saw the accumulation contract broken.

    ``rule`` is the failure-class id (``"F1"`` ...), ``window`` and ``micro_step``
    (0-based) say where, ``seen``/``expected`` what.
    """

    rule = "F?"
    title = "accumulation contract"

    def __init__(self, message: str, *, window: int, micro_step: int | None, seen: str,
                 expected: str) -> None:
        super().__init__(message)
        self.window = window
        self.micro_step = micro_step
        self.seen = seen
        self.expected = expected


class StepInsideWindowError(GuardViolation):
    rule, title = "F1", "optimizer step inside the window"


class ExtraStepError(GuardViolation):
    rule, title = "F1", "more than one optimizer step per window"


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


# -- records --------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class Violation:
    """One observed violation (kept in :attr:`AccumulationGuard.violations`, in both modes)."""

    rule: str
    error: str
    window: int
    micro_step: int | None
    message: str


@dataclass(frozen=True)
class WindowRecord:
    """What one closed window did: the per-window counts the guard checked."""

    index: int
    backward_passes: int
    sync_rounds: int
    optimizer_steps: int
    scheduler_steps: int
    zero_grads: int


# -- the guard ------------------------------------------------------------------------------

class AccumulationGuard:
    """Checks, per window, the boundary contract of gradient accumulation.

    Per window of ``accumulation_steps`` (K) backward passes: exactly one
    optimizer step, after the K-th backward (F1); no zero_grad before it (F3);
    one scheduler step per optimizer step (F4); gradients cleared before the
    next window (F7); clipping/unscaling only at the boundary, unscale first
    (F8); on DDP, a gradient all-reduce decided at forward time on the right
    micro-steps and not flipped before backward (F11); no more than K
    backward passes per window (F13).

    Args:
        model: the model as the loop calls it (the DDP-wrapped module on DDP).
        optimizer: the optimizer the loop steps.
        accumulation_steps: K.
        scheduler: an LR scheduler that the loop steps once per optimizer step.
        scaler: a ``torch.amp.GradScaler`` (its skipped steps count as steps).
        mode: ``"raise"`` (default) raises the violation; ``"warn"`` emits one
            :class:`~accumguard.core.errors.AccumguardWarning` per rule and goes on.
        sync: on DDP, ``"deferred"`` (default: only the window's last micro-step
            all-reduces), ``"eager"`` (every micro-step does), or ``"any"`` (only
            the last one must). Ignored for other models.
        total_micro_batches: micro-batches per rank in the run, so the short
            final window is known in advance (or declare it: :meth:`expect_window`).
        check_sync_every: every N optimizer steps, all-gather a checksum of the
            gradients the optimizer is about to use and require it to agree across
            ranks (one small collective; DDP-style replicated gradients only).
        history: how many :class:`WindowRecord` to keep.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 accumulation_steps: int, scheduler: Any = None, scaler: Any = None,
                 mode: str = "raise", sync: str = "deferred",
                 total_micro_batches: int | None = None, check_sync_every: int | None = None,
                 history: int = 1000) -> None:
        check_accumulation_steps(accumulation_steps)
        if mode not in ("raise", "warn"):
            raise ConfigError(f"`mode` ({mode!r}) must be 'raise' or 'warn'")
        if sync not in _SYNC_MODES:
            raise ConfigError(f"`sync` ({sync!r}) must be one of {_SYNC_MODES}: 'deferred' when "
                              "non-final micro-steps run under no_sync, 'eager' when every "
                              "micro-step all-reduces, 'any' to check only the last one")
        if total_micro_batches is not None and (isinstance(total_micro_batches, bool) or not
                                                isinstance(total_micro_batches, int)
                                                or total_micro_batches < 1):
            raise ConfigError(f"`total_micro_batches` ({total_micro_batches!r}) must be a "
                              "positive int: the number of micro-batches each rank runs")
        if check_sync_every is not None:
            check_accumulation_steps(check_sync_every, "check_sync_every")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer, got "
                              f"{type(optimizer).__name__}")
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.scheduler = scheduler
        self.scaler = scaler
        self.mode = mode
        self.sync = sync
        self.total_micro_batches = total_micro_batches
        self.check_sync_every = check_sync_every
        from torch.nn.parallel import DistributedDataParallel

        self._ddp = model if isinstance(model, DistributedDataParallel) else None
        if check_sync_every is not None and self._ddp is None:
            raise ConfigError(
                f"check_sync_every={check_sync_every} compares the synchronised gradient across "
                f"ranks, which only a DistributedDataParallel model replicates; got "
                f"{type(model).__name__} (sharded engines hold different shards on each rank "
                "by design). Drop check_sync_every for this model")
        # Cached once: model.parameters() walks the module tree on every call.
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._param_ids = frozenset(id(p) for p in self._params)
        self._rank, self._world = _dist_info()
        # state machine
        self.phase = Phase.OPEN
        self.window = 0
        self._backwards = 0
        self._consumed = 0  # micro-steps of closed windows
        self._declared: int | None = None
        self._window_syncs = 0
        self._window_steps = 0
        self._window_sched = 0
        self._window_zero = 0
        self._cleared = True
        self._unscaled = False
        self._sentinel: torch.Tensor | None = None
        self._fwd_sync: bool | None = None
        self._in_backward = False
        # audit trail
        self.backward_passes = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self.scheduler_steps = 0
        self.sync_rounds = 0
        self.windows_closed = 0
        self.windows: deque[WindowRecord] = deque(maxlen=history)
        self.violations: list[Violation] = []
        self._warned: set[str] = set()
        # installation
        self._installed = False
        self._handles: list[Any] = []
        self._restore: list[Callable[[], None]] = []

    # -- lifecycle -------------------------------------------------------------------------
    def install(self) -> AccumulationGuard:
        """Install hooks and wrappers; :meth:`close` removes them. Returns ``self``."""
        if self._installed:
            raise UsageError("this guard is already installed; create one guard per loop")
        self._installed = True
        try:
            self._handles.append(self.model.register_forward_hook(self._forward_hook))
            self._handles.append(self.optimizer.register_step_pre_hook(self._step_pre_hook))
            self._wrap(self.optimizer, "zero_grad", self._on_zero_grad)
            self._wrap(self.model, "zero_grad", self._on_zero_grad)
            inner = getattr(self.model, "module", None)
            if isinstance(inner, torch.nn.Module):
                self._wrap(inner, "zero_grad", self._on_zero_grad)
            if self.scheduler is not None:
                self._wrap(self.scheduler, "step", self._on_scheduler_step)
            if self.scaler is not None:
                self._wrap(self.scaler, "unscale_", self._on_unscale)
                self._wrap(self.scaler, "update", self._on_scaler_update)
            self._patch_clip()
        except BaseException:
            self._uninstall()
            raise
        return self

    def close(self, *, check: bool = True) -> None:
        """Remove every hook, restore every wrapped object, then (``check``) verify that
        the last window was completed and its scheduler stepped."""
        if not self._installed:
            return
        self._uninstall()
        if check:
            self._final_checks()

    def __enter__(self) -> AccumulationGuard:
        return self.install()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # After an exception the loop stopped mid-way: do not pile a second error on it.
        self.close(check=exc_type is None)

    def _uninstall(self) -> None:
        for h in reversed(self._handles):
            h.remove()
        self._handles.clear()
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()
        self._installed = False

    def _wrap(self, obj: Any, name: str, before: Callable[..., None]) -> None:
        """Shadow ``obj.name`` with an instance attribute calling ``before`` first."""
        had_own = name in vars(obj)
        previous_own = vars(obj).get(name)
        bound = getattr(obj, name)

        @functools.wraps(bound)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._installed:
                before()
            return bound(*args, **kwargs)

        setattr(obj, name, wrapper)

        def undo() -> None:
            if had_own:
                setattr(obj, name, previous_own)
            else:
                delattr(obj, name)

        self._restore.append(undo)

    def _patch_clip(self) -> None:
        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_mod

        for mod in (nn_utils, clip_mod):
            previous = mod.clip_grad_norm_
            wrapped = self._clip_wrapper(previous)
            mod.clip_grad_norm_ = wrapped

            def undo(mod: Any = mod, previous: Any = previous) -> None:
                mod.clip_grad_norm_ = previous

            self._restore.append(undo)

    def _clip_wrapper(self, previous: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(previous)
        def clip_grad_norm_(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if self._installed:
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                if any(id(p) in self._param_ids for p in params):
                    self._on_clip()
                parameters = params
            return previous(parameters, *args, **kwargs)

        return clip_grad_norm_

    # -- declarations -----------------------------------------------------------------------
    def expect_window(self, size: int) -> None:
        """Declare the size of the current (or, right after a step, the next) window:
        a short final window of ``size`` < K micro-steps is then legal."""
        check_accumulation_steps(size, "size")
        if size > self.accumulation_steps:
            raise ConfigError(f"expect_window({size}): a window holds at most "
                              f"accumulation_steps={self.accumulation_steps} micro-steps")
        done = 0 if self.phase is Phase.STEPPED else self._backwards
        if size < done:
            raise UsageError(f"expect_window({size}) but window {self.window} already ran {done} "
                             "backward passes; declare the size before its first micro-step")
        if self.phase is Phase.STEPPED:
            self._open_next_window()
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

    # -- events ---------------------------------------------------------------------------------
    def _forward_hook(self, module: Any, args: Any, output: Any) -> None:
        node = _output_grad_fn(output)
        if node is None:
            return
        if self._ddp is not None:
            # DDP read this flag when its forward began; nothing inside forward changes it,
            # so reading it here (one hook instead of two) sees the same decision.
            self._fwd_sync = bool(self._ddp.require_backward_grad_sync)
        node.register_prehook(self._grad_fn_prehook)

    def _grad_fn_prehook(self, grad_outputs: Any) -> None:
        if not self._installed or self._in_backward:
            return
        self._in_backward = True
        _queue_callback(self._backward_done)
        self._on_backward()

    def _backward_done(self) -> None:
        self._in_backward = False

    def _on_backward(self) -> None:
        if self.phase is Phase.STEPPED:
            self._open_next_window()
        size = self.window_size()
        j = self._backwards
        if self.total_micro_batches is not None and self._consumed + j >= self.total_micro_batches:
            self._violate(WindowOverrunError, j,
                          f"backward pass number {self._consumed + j + 1} of this rank",
                          f"at most total_micro_batches={self.total_micro_batches}",
                          "the loop runs more micro-batches than declared; pass the right "
                          "total_micro_batches (micro-batches per rank) or fix the data loader")
        elif self.phase is Phase.FULL:
            self._violate(WindowOverrunError, j,
                          f"backward pass {j + 1} in a window of {size} without an optimizer step",
                          f"optimizer.step() after backward pass {size}",
                          f"step when (micro_step + 1) % {self.accumulation_steps} == 0; an "
                          "accumulation counter that is off by one (often after resume or at an "
                          "epoch boundary) makes windows of K+1")
        if j >= 1:
            self._check_not_cleared(j)
        if self._ddp is not None:
            self._check_sync(j, size)
        self._backwards += 1
        self.backward_passes += 1
        if self.phase is not Phase.FULL:
            self.phase = Phase.FULL if self._backwards >= size else Phase.ACCUMULATING

    def _check_sync(self, j: int, size: int) -> None:
        assert self._ddp is not None
        decided = self._fwd_sync
        now = bool(self._ddp.require_backward_grad_sync)
        if decided is not None and now != decided:
            self._violate(
                GradientSyncError, j,
                f"require_backward_grad_sync={decided} at forward but {now} at backward",
                "the same value at forward and backward (DDP decides at forward time)",
                "enter model.no_sync() (or set require_backward_grad_sync) *before* the forward "
                "and keep it until after backward: a flag set after forward does nothing for "
                "this backward")
        synced = bool(decided) if decided is not None else now
        if synced:
            self.sync_rounds += 1
            self._window_syncs += 1
        last = j == size - 1
        if last and not synced:
            self._violate(
                GradientSyncError, j,
                "no gradient all-reduce on the window's last micro-step",
                "one all-reduce on the last micro-step", "run the last micro-step's forward and "
                "backward outside model.no_sync(); otherwise the optimizer steps on this rank's "
                "unsynchronised gradient")
        elif not last and synced and self.sync == "deferred":
            self._violate(
                GradientSyncError, j,
                f"a gradient all-reduce on non-final micro-step {j} of {size}",
                "no collective before the last micro-step (sync='deferred')",
                "run forward *and* backward of micro-steps 0..K-2 inside model.no_sync() "
                "(a no_sync around backward only does nothing), or pass sync='eager' to the "
                "guard if reducing every micro-step is intended")
        elif not last and not synced and self.sync == "eager":
            self._violate(
                GradientSyncError, j, f"no all-reduce on micro-step {j} of {size}",
                "an all-reduce on every micro-step (sync='eager')",
                "pass sync='deferred' if no_sync on non-final micro-steps is intended")

    def _check_not_cleared(self, j: int) -> None:
        """Gradients set to None between micro-steps by a route the guard does not wrap."""
        s = self._sentinel
        if s is None:
            s = next((p for p in self._params if p.grad is not None), None)
            self._sentinel = s
            if s is not None:
                return
        elif s.grad is not None:
            return
        self._violate(ZeroGradInsideWindowError, j,
                      f"gradients were cleared (set to None) before backward pass {j + 1}",
                      "gradients kept for the whole window",
                      "clear gradients only after optimizer.step(); a zero_grad (or p.grad = None) "
                      "between micro-steps keeps only the last micro-batches' gradient")

    def _open_next_window(self) -> None:
        """Close the stepped window (check its scheduler and that grads were cleared)."""
        self._close_record()
        if (self.scheduler is not None and self._window_sched == 0
                and self._window_steps + self.skipped_steps > 0):
            self._violate(SchedulerStepError, None, "0 scheduler.step() calls in the window",
                          "exactly one scheduler.step() per optimizer step",
                          "call scheduler.step() once after each optimizer.step(); pass "
                          "scheduler= to the guard only for a per-optimizer-step scheduler")
        if not self._cleared and self._grads_nonzero():
            self._violate(GradientLeakError, None,
                          "gradients still set when the next window started (no zero_grad "
                          "after the optimizer step)",
                          "gradients cleared between windows",
                          "call optimizer.zero_grad() after optimizer.step(); otherwise this "
                          "window's gradient is added to the next one")
        self._consumed += self._backwards
        self.window += 1
        self._backwards = 0
        self._declared = None
        self._window_syncs = self._window_steps = self._window_sched = self._window_zero = 0
        self._cleared = True
        self._unscaled = False
        self._sentinel = None
        self.phase = Phase.OPEN

    def _close_record(self) -> None:
        self.windows_closed += 1
        self.windows.append(WindowRecord(
            index=self.window, backward_passes=self._backwards, sync_rounds=self._window_syncs,
            optimizer_steps=self._window_steps, scheduler_steps=self._window_sched,
            zero_grads=self._window_zero))

    def _grads_nonzero(self) -> bool:
        return any(p.grad is not None and bool(p.grad.count_nonzero()) for p in self._params)

    def _step_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._installed:
            return
        size = self.window_size()
        j = self._backwards - 1 if self._backwards else None
        if self.phase is Phase.STEPPED:
            self._violate(ExtraStepError, j, "a second optimizer.step() in the window",
                          "exactly one optimizer.step() per window",
                          "step once per window, after its last backward")
        elif self.phase is Phase.OPEN:
            self._violate(ExtraStepError, None, "optimizer.step() with no backward pass in the "
                          "window", f"optimizer.step() after {size} backward passes",
                          "step once per window, after its last backward")
        elif self.phase is Phase.ACCUMULATING:
            self._violate(StepInsideWindowError, j,
                          f"optimizer.step() after {self._backwards} of {size} backward passes",
                          f"one optimizer.step() after backward pass {size}",
                          f"step only when (micro_step + 1) % {self.accumulation_steps} == 0 (and "
                          "after the final short window); or use accumguard.Accumulator. A "
                          "short final window must be declared: guard.expect_window(n) or "
                          "total_micro_batches=")
        self.phase = Phase.STEPPED
        self._window_steps += 1
        self.optimizer_steps += 1
        self._cleared = False
        if (self.check_sync_every is not None and self._world > 1
                and self.optimizer_steps % self.check_sync_every == 0):
            self._check_ranks_agree(j)

    def _check_ranks_agree(self, j: int | None) -> None:
        import torch.distributed as dist

        grads = [p.grad for p in self._params if p.grad is not None]
        if grads:
            flat = torch.stack([torch.stack([g.detach().double().sum(),
                                             g.detach().double().abs().sum()]) for g in grads])
            local = flat.sum(0)
        else:
            local = torch.zeros(2, dtype=torch.float64)
        device = grads[0].device if grads else torch.device("cpu")
        local = local.to(device)
        gathered = [torch.empty_like(local) for _ in range(self._world)]
        dist.all_gather(gathered, local)
        table = torch.stack(gathered).cpu()
        ref = table[0]
        tol = 1e-9 * float(ref.abs().max()) + 1e-30
        if float((table - ref).abs().max()) > tol:
            sums = ", ".join(f"rank {r}: {float(row[1]):.9g}" for r, row in enumerate(table))
            self._violate(GradientDesyncError, j,
                          f"gradient |sum| differs across ranks at optimizer step "
                          f"{self.optimizer_steps} ({sums})",
                          "identical synchronised gradients on every rank",
                          "make the window's last micro-step all-reduce (its forward and backward "
                          "outside no_sync); a sync flag set after forward leaves ranks apart")

    def _on_zero_grad(self) -> None:
        if self.phase in (Phase.ACCUMULATING, Phase.FULL):
            j = self._backwards - 1
            self._violate(ZeroGradInsideWindowError, j,
                          f"zero_grad() after {self._backwards} of {self.window_size()} backward "
                          "passes, before the optimizer step",
                          "zero_grad() only after optimizer.step() (or before the window's "
                          "first backward)",
                          "move zero_grad() next to optimizer.step(); clearing between micro-"
                          "steps keeps only the last micro-batches' gradient")
        self._window_zero += 1
        self._cleared = True

    def _on_scheduler_step(self) -> None:
        j = self._backwards - 1 if self._backwards else None
        if self.phase is not Phase.STEPPED:
            self._violate(SchedulerStepError, j,
                          f"scheduler.step() after {self._backwards} of {self.window_size()} "
                          "backward passes, before the window's optimizer step",
                          "one scheduler.step() after each optimizer.step()",
                          "step the scheduler next to optimizer.step(), once per window: stepped "
                          "per micro-step the learning rate runs K times ahead of its schedule")
        elif self._window_sched >= 1:
            self._violate(SchedulerStepError, j, "a second scheduler.step() for one optimizer "
                          "step", "exactly one scheduler.step() per optimizer step",
                          "step the scheduler once per window")
        self._window_sched += 1
        self.scheduler_steps += 1

    def _on_clip(self) -> None:
        j = self._backwards - 1 if self._backwards else None
        if self.phase is not Phase.FULL:
            self._violate(ClipInsideWindowError, j,
                          f"clip_grad_norm_() after {self._backwards} of {self.window_size()} "
                          "backward passes" + (" (after the step)" if self.phase is Phase.STEPPED
                                               else ""),
                          "clipping once, after the window's last backward and before the step",
                          "clip the accumulated (and synchronised) gradient once per window; "
                          "clipping each micro-step shrinks every micro-batch's gradient "
                          "separately")
        elif (self.scaler is not None and _scaler_enabled(self.scaler)
              and not self._unscaled):
            self._violate(ClipInsideWindowError, j, "clip_grad_norm_() before scaler.unscale_()",
                          "scaler.unscale_(optimizer) before clipping",
                          "call scaler.unscale_(optimizer) right before clip_grad_norm_: "
                          "clipping scaled gradients compares the norm with a threshold "
                          "scale times too small")

    def _on_unscale(self) -> None:
        if self.phase is not Phase.FULL:
            j = self._backwards - 1 if self._backwards else None
            self._violate(ClipInsideWindowError, j,
                          f"scaler.unscale_() after {self._backwards} of {self.window_size()} "
                          "backward passes", "unscale_ once, after the window's last backward",
                          "unscale once per window, right before clipping and the step")
        self._unscaled = True

    def _on_scaler_update(self) -> None:
        if self.phase is Phase.FULL:
            # GradScaler.step skipped optimizer.step (inf/nan): the window still ended.
            self.phase = Phase.STEPPED
            self.skipped_steps += 1
            self._cleared = False

    def _final_checks(self) -> None:
        if self.phase in (Phase.ACCUMULATING, Phase.FULL):
            self._violate(GradientLeakError, self._backwards - 1,
                          f"the guard closed with {self._backwards} of {self.window_size()} "
                          "backward passes and no optimizer step",
                          "every window ends with an optimizer step",
                          "step on the final short window too (declare it with "
                          "guard.expect_window(n) or total_micro_batches=), or drop it on purpose "
                          "before its first backward")
        elif self.phase is Phase.STEPPED:
            sched_missing = self.scheduler is not None and self._window_sched == 0
            self._close_record()
            self.phase = Phase.OPEN
            if sched_missing:
                self._violate(SchedulerStepError, None, "0 scheduler.step() calls in the last "
                              "window", "exactly one scheduler.step() per optimizer step",
                              "call scheduler.step() once after each optimizer.step()")

    # -- reporting ------------------------------------------------------------------------------
    def _violate(self, cls: type[GuardViolation], micro_step: int | None, seen: str,
                 expected: str, fix: str) -> None:
        where = f"window {self.window}" + ("" if micro_step is None
                                           else f", micro-step {micro_step}")
        prefix = rank_prefix(self._rank if self._world > 1 else None)
        message = (f"{prefix}[{cls.rule} {cls.title}] {where}: saw {seen}; expected {expected}. "
                   f"Fix: {fix}.")
        self.violations.append(Violation(rule=cls.rule, error=cls.__name__, window=self.window,
                                         micro_step=micro_step, message=message))
        if self.mode == "raise":
            raise cls(message, window=self.window, micro_step=micro_step, seen=seen,
                      expected=expected)
        key = cls.__name__
        if key not in self._warned:
            self._warned.add(key)
            log.warning("accumguard guard: %s", message)
            warnings.warn(message, AccumguardWarning, stacklevel=3)

    def summary(self) -> dict[str, int]:
        """Counts so far, for logs and tests."""
        return {"windows": self.windows_closed,
                "backward_passes": self.backward_passes, "optimizer_steps": self.optimizer_steps,
                "skipped_steps": self.skipped_steps, "scheduler_steps": self.scheduler_steps,
                "sync_rounds": self.sync_rounds, "violations": len(self.violations)}


def guard(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, accumulation_steps: int,
          scheduler: Any = None, scaler: Any = None, mode: str = "raise",
          sync: str = "deferred", total_micro_batches: int | None = None,
          check_sync_every: int | None = None) -> AccumulationGuard:
    """Build an :class:`AccumulationGuard`; use it as ``with guard(...):`` or call
    ``.install()`` / ``.close()``. See the class for the arguments."""
    return AccumulationGuard(model, optimizer, accumulation_steps=accumulation_steps,
                             scheduler=scheduler, scaler=scaler, mode=mode, sync=sync,
                             total_micro_batches=total_micro_batches,
                             check_sync_every=check_sync_every)


# -- helpers --------------------------------------------------------------------------------

def _output_grad_fn(output: Any) -> Any:
    """The autograd node of the first tensor in a forward's output that backward will run
    through (``None`` if there is none: evaluation, or no grad)."""
    if isinstance(output, torch.Tensor):
        return output.grad_fn
    values: Iterable[Any]
    if isinstance(output, dict):
        values = output.values()
    elif isinstance(output, (list, tuple)):
        values = output
    elif hasattr(output, "__dataclass_fields__"):
        values = (getattr(output, f) for f in output.__dataclass_fields__)
    else:
        return None
    for v in values:
        if isinstance(v, torch.Tensor) and v.grad_fn is not None:
            return v.grad_fn
    return None


def _queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the current autograd pass ends (the engine DDP and FSDP use)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def _scaler_enabled(scaler: Any) -> bool:
    is_enabled = getattr(scaler, "is_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True


def _dist_info() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
