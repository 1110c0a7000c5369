"""A cheap runtime sentinel for the accumulation boundary contract.

:func:`guard` watches a training loop you already have (hand-written, the
:class:`~accumguard.Accumulator`, a DeepSpeed engine, Accelerate's prepared objects)
and raises the moment the contract of one optimizer step per window of K micro-steps
is broken::

    with accumguard.runtime.guard(model, optimizer, accumulation_steps=4, scheduler=sched):
        for i, batch in enumerate(loader):
            last = (i + 1) % 4 == 0
            with contextlib.nullcontext() if last else model.no_sync():
                loss_fn(model, batch).backward()
            if last:
                optimizer.step(); sched.step(); optimizer.zero_grad()

    with accumguard.runtime.guard(engine, None, accumulation_steps=4):   # DeepSpeed
        ...

It installs nothing of its own: it is a listener of the one observation layer
(:class:`accumguard.observe.Observer`, rooted at ``model``), which sees backward
passes (whatever the model returns), optimizer/engine steps, ``zero_grad``, scheduler
steps, clipping (also imported as ``from torch.nn.utils import clip_grad_norm_``),
GradScaler calls and the DDP sync flag, and which computes the gradient-conservation
verdict (did the gradient of every micro-step reach the optimizer?). The guard keeps
the events of its own model and optimizer (:mod:`._guard_targets`) and runs them
through its state machine (:mod:`._guard_machine`: the phases, one message per illegal
transition); the violation classes are in :mod:`._guard_errors`.

Errors name only mathematical differences. Correct but wasteful patterns (an
all-reduce on a non-final micro-step, ``no_sync`` spanning only the backward) are
*notes* (:attr:`AccumulationGuard.notes`, one warning each). Gradient conservation
replaces "a gradient was None": FSDP2's ``set_requires_gradient_sync(False)``,
DeepSpeed's engine buffers and fp32 gradient buffers are correct. Conservation is
checked on the first windows and then on as many as ~0.5 % of the run's time allows
(always on the windows after a ``zero_grad`` inside a window that was not checked).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

import torch

from accumguard.core.boundary import check_accumulation_steps
from accumguard.core.errors import AccumguardWarning, ConfigError, UsageError, rank_prefix
from accumguard.core.window import StepRecord
from accumguard.observe import FORCED_CHECKS, checksums
from accumguard.observe._agree import gather_rows
from accumguard.observe._events import (
    BackwardEvent,
    ClipEvent,
    EngineStepEvent,
    ForwardEvent,
    ScalerEvent,
    SchedulerEvent,
    StepStartEvent,
    ZeroGradEvent,
)
from accumguard.observe._shared_rules import double_gating, engine_resets
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
    ShortWindowError,
    StepInsideWindowError,
    Violation,
    WindowOverrunError,
    ZeroGradInsideWindowError,
)
from accumguard.runtime._guard_machine import EngineReset, GuardMachine, Phase
from accumguard.runtime._guard_targets import Targets, resolve_targets, step_hook_owner

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from accumguard.observe._failsafe import Failsafe, Failure
    from accumguard.observe._observer import Observer

__all__ = [
    "AccumulationGuard",
    "ClipInsideWindowError",
    "DoubleGatingError",
    "EngineBoundaryResetError",
    "ExtraStepError",
    "GradientDesyncError",
    "GradientLeakError",
    "GradientSyncError",
    "GuardNote",
    "GuardViolation",
    "Phase",
    "SchedulerStepError",
    "ShortWindowError",
    "StepInsideWindowError",
    "Violation",
    "WindowOverrunError",
    "ZeroGradInsideWindowError",
    "guard",
]

_SYNC_MODES = ("deferred", "eager", "any")


def __getattr__(name: str) -> object:
    """``WindowRecord``: the guard's closed window is now the one window record of every
    judge, :class:`accumguard.core.window.StepRecord` (``index``, ``backward_passes``,
    ``sync_rounds`` still read as before); the old name works for one release."""
    if name == "WindowRecord":
        warnings.warn("accumguard.runtime.guard.WindowRecord is now "
                      "accumguard.core.window.StepRecord; import it from there (the old name "
                      "goes away in the next release)", DeprecationWarning, stacklevel=2)
        return StepRecord
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class AccumulationGuard(GuardMachine):
    """Checks, per window, the boundary contract of gradient accumulation.

    Per window of ``accumulation_steps`` (K) backward passes: exactly one
    optimizer step, after the K-th backward (F1); everything the backwards
    contributed reaches the optimizer (F3, F2 on DeepSpeed ZeRO-1/2); one scheduler
    step per optimizer step (F4); gradients cleared before the next window (F7);
    clipping/unscaling only at the boundary, unscale first (F8); on DDP, the
    window's last micro-step all-reduces (F11); no more than K backward passes per
    window (F13); on DeepSpeed, no K-loop around a K-accumulating engine (F14).

    Args:
        model: the model as the loop calls it (the DDP/FSDP2 module, the DeepSpeed engine).
        optimizer: the optimizer the loop steps: a torch optimizer, Accelerate's
            ``AcceleratedOptimizer``, a ``ZeroRedundancyOptimizer``; with a DeepSpeed
            engine ``None`` or any optimizer (the engine's ``step()`` is the step).
        accumulation_steps: K.
        scheduler: an LR scheduler that the loop steps once per optimizer step.
        scaler: a ``torch.amp.GradScaler`` (its skipped steps count as steps).
        mode: ``"raise"`` (default) raises the violation; ``"warn"`` emits one
            :class:`~accumguard.core.errors.AccumguardWarning` per rule and goes on.
        sync: on DDP, what the non-final micro-steps are meant to do: ``"deferred"``
            (default: no all-reduce), ``"eager"`` (all-reduce each), ``"any"``. A
            mismatch is a note (correct, maybe wasteful); the last micro-step must
            all-reduce in every mode.
        total_micro_batches: micro-batches per rank in the run, so the short
            final window is known in advance (or declare it: :meth:`expect_window`).
        check_sync_every: every N optimizer steps, all-gather a checksum of the
            gradients the optimizer is about to use and require it to agree across
            ranks (one small collective; DDP-style replicated gradients only).
        history: how many closed windows to keep in :attr:`windows` (each one
            :class:`~accumguard.core.window.StepRecord`).
    """

    def __init__(self, model: torch.nn.Module, optimizer: object, *,
                 accumulation_steps: int, scheduler: object = None,
                 scaler: torch.amp.GradScaler | None = None,
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
        self.targets: Targets = resolve_targets(model, optimizer, scheduler, scaler)
        if check_sync_every is not None and self.targets.ddp is None:
            raise ConfigError(
                f"check_sync_every={check_sync_every} compares the synchronised gradient across "
                f"ranks, which only a DistributedDataParallel model replicates; got "
                f"{type(model).__name__} (sharded engines hold different shards on each rank "
                "by design). Drop check_sync_every for this model")
        rank, world = _dist_info()
        super().__init__(accumulation_steps=accumulation_steps, mode=mode, sync=sync,
                         total_micro_batches=total_micro_batches, history=history,
                         rank=rank if world > 1 else None, has_scheduler=scheduler is not None)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.check_sync_every = check_sync_every
        self._world = world
        self._installed = False
        self.observer: Observer | None = None
        #: accumguard's own failure (:class:`accumguard.observe.Failure`): the guard judged
        #: nothing after it
        self.failure: Failure | None = None
        self._sync_handle: RemovableHandle | None = None  # check_sync_every: optimizer pre-hook
        self._sync_failsafe: Failsafe | None = None
        self._sync_steps = 0
        self._sync_off = False
        self._ever_reached = False
        self.checked_windows = 0  # windows whose gradient conservation was verified
        # the guarded optimizer stepped inside a backward pass (an optimizer in backward):
        # its windows are cut by the backward they end in, so the guard judges nothing
        # from there on (said once, as a note); the run is unchanged
        self.unfollowed = False
        self._leak_suspect: bool | None = None
        # The forward's sync flag matters to a DDP model only: without one the observer
        # finds no ``on_forward`` listener and builds no event per micro-step.
        self.on_forward: Callable[[ForwardEvent], None] | None = (
            self._on_ddp_forward if self.targets.ddp is not None else None)

    # -- lifecycle -------------------------------------------------------------------------
    def install(self) -> AccumulationGuard:
        """Install the observation layer for this guard; :meth:`close` removes it."""
        if self._installed:
            raise UsageError("this guard is already installed; create one guard per loop")
        from accumguard.observe import Observer
        from accumguard.observe import _profiles as profiles

        owner = None
        if self.check_sync_every is not None and self._world > 1:
            owner = step_hook_owner(self.optimizer)
            if owner is None:
                raise ConfigError(
                    f"check_sync_every={self.check_sync_every}: no torch optimizer found "
                    f"behind {type(self.optimizer).__name__} to hook the check on; drop "
                    "check_sync_every or pass the torch optimizer the loop steps")
        self.observer = Observer.from_profile(profiles.guard(), [self.model])
        self.observer.add_listener(self)
        self._installed = True
        self.observer.install()  # an internal error there leaves it off, with ``failure`` set
        if self.observer.failure is not None:
            self.failure = self.observer.failure
        if owner is not None:
            self._sync_failsafe = self.observer.failsafe
            self._sync_handle = owner.register_step_pre_hook(self._sync_pre)
        return self

    def close(self, *, check: bool = True) -> None:
        """Remove every patch and hook, then (``check``) verify that the last window was
        completed and the scheduler kept up."""
        if not self._installed:
            return
        self._uninstall()
        if check and self.failure is None and not self.unfollowed:
            # (after accumguard's own failure, or an optimizer in backward: nothing to judge)
            self.final_checks()

    def __enter__(self) -> AccumulationGuard:
        return self.install()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # After an exception the loop stopped mid-way: do not pile a second error on it.
        self.close(check=exc_type is None)

    def _uninstall(self) -> None:
        self._installed = False
        if self._sync_handle is not None:
            self._sync_handle.remove()
            self._sync_handle = None
        if self.observer is not None:
            self.failure = self.observer.failure
            self.observer.uninstall()
            self.observer = None

    def on_internal_error(self, failure: Failure) -> None:
        """accumguard itself failed (not the loop): the guard stops judging; the loop goes
        on unchanged, and :attr:`failure` says what happened (also printed on stderr)."""
        self.failure = failure

    # -- observer events -------------------------------------------------------------------
    def _on_ddp_forward(self, ev: ForwardEvent) -> None:
        if self.unfollowed:
            return
        if ev.module is self.model:
            self.forward(ev.sync)

    def on_backward_start(self, ev: BackwardEvent) -> None:
        if self.unfollowed:
            return
        # The leak check reads .grad before this backward adds to it (only when no
        # zero_grad was seen since the step: then the gradients must be None or zero).
        self._leak_suspect = None
        if self.phase is Phase.STEPPED and not self._cleared:
            self._leak_suspect = self._grads_nonzero()
        elif self.phase is Phase.OPEN and self.window == 0 and not self._backwards:
            self._leak_suspect = self._grads_nonzero()  # a resumed run's restored gradient

    def on_backward(self, ev: BackwardEvent) -> None:
        if self.unfollowed:
            return
        if ev.reached:
            self._ever_reached = True
        elif ev.reached is False and (ev.forwards or self._ever_reached):
            return  # another model's loss (a GAN's other half): not this guard's backward
        suspect, self._leak_suspect = self._leak_suspect, None
        info = self.observer.engine_info if self.observer is not None else None
        reset: EngineReset | None = None
        if info is not None and engine_resets(info.zero_stage, info.managed_accumulation,
                                              ev.ds_boundary, ev.ds_coalescing):
            reset = {"stage": info.zero_stage, "ds_ga": info.gradient_accumulation_steps}
        self.backward(sync_forward=ev.sync_forward, sync_backward=ev.sync_backward,
                      ddp=self.targets.ddp is not None, engine_reset=reset,
                      grads_set=_true if suspect else None, forwards=ev.forwards,
                      new_pass=ev.new_pass)

    def on_step_start(self, ev: StepStartEvent) -> None:
        if self.unfollowed or not self.targets.owns_step(ev.owner, ev.source):
            return
        if ev.in_backward:
            self.unfollowed = True
            warnings.warn(AccumguardWarning(
                f"{rank_prefix(self._rank)}the guarded optimizer stepped inside a backward "
                "pass (an optimizer stepped from a gradient hook, e.g. "
                "register_post_accumulate_grad_hook): the guard does not follow such windows "
                "and checks nothing from here on; the run is unchanged"), stacklevel=2)
            return
        # The observer's window is the run since any step of the process; its verdict is
        # about this guard's window only when both counted the same backward passes (not
        # after a GradScaler-skipped step or another optimizer's step).
        cons = ev.conservation if ev.backwards == self._backwards else None
        if cons is not None:
            self.checked_windows += 1
        unverified = None
        if cons is None and self._zero_at is not None and self.observer is not None:
            info = self.observer.engine_info
            if info is not None and (info.zero_stage or 0) >= 1:
                unverified = f"DeepSpeed ZeRO-{info.zero_stage} keeps gradients in its buffers"
            else:
                self.observer.force_checks = FORCED_CHECKS  # verify the next windows
        # a step with no backward since the previous one applies a gradient again when one
        # is left in .grad (read only then: a rare event)
        moved = (True if self.phase in (Phase.STEPPED, Phase.OPEN) and ev.applied
                 and self._grads_nonzero() else None)
        self.step(conservation=cons, unverified=unverified,
                  deepspeed=ev.source == "deepspeed",
                  applied=ev.applied or ev.source != "torch", sharded=ev.engine == "fsdp2",
                  moved=moved)

    def on_engine_step(self, ev: EngineStepEvent) -> None:
        if self.unfollowed:
            return
        info = self.observer.engine_info if self.observer is not None else None
        ga = info.gradient_accumulation_steps if info is not None else None
        if (not ev.boundary and self.targets.owns_step(ev.owner, "deepspeed")
                and self.phase is Phase.FULL and isinstance(ga, int) and ga > 1
                and ev.backwards > 1):
            if double_gating(ga, ev.backwards, self._backwards):
                self.double_gating(since=ev.backwards, ds_ga=int(ga or 1))
            else:  # judged when the window goes on (K step() calls after K backwards: fine)
                self.gated_without_step(since=ev.backwards, ds_ga=int(ga or 1))

    def on_zero_grad(self, ev: ZeroGradEvent) -> None:
        if self.unfollowed:
            return
        owned = (self.targets.owns_optimizer(ev.owner) if ev.kind == "optimizer"
                 else self.targets.owns_module(ev.owner))
        if owned:
            self.zero_grad()

    def on_scheduler_step(self, ev: SchedulerEvent) -> None:
        if self.unfollowed:
            return
        if id(ev.owner) in self.targets.scheduler_ids:
            self.scheduler_step()

    def on_clip(self, ev: ClipEvent) -> None:
        if self.unfollowed:
            return
        ids = self.targets.param_ids
        if any(id(p) in ids for p in ev.params):
            self.clip(scaler_enabled=self.scaler is not None and _scaler_enabled(self.scaler))

    def on_unscale(self, ev: ScalerEvent) -> None:
        if self.unfollowed:
            return
        if ev.owner is self.scaler:
            self.unscale()

    def on_scaler_update(self, ev: ScalerEvent) -> None:
        if self.unfollowed:
            return
        if ev.owner is self.scaler:
            self.skipped_step()

    def on_scaler_skip(self, ev: ScalerEvent) -> None:
        """A GradScaler skipped this guard's optimizer (inf/NaN gradients): the window
        ended, whether or not the guard was given that scaler (``skipped_step`` counts a
        window once, so the scaler's own update after it changes nothing)."""
        if self.unfollowed:
            return
        if self.targets.owns_optimizer(ev.owner):
            self.skipped_step()

    # -- helpers ------------------------------------------------------------------------------
    def _grads_nonzero(self) -> bool:
        return any(p.grad is not None and bool(p.grad.count_nonzero())
                   for p in self.targets.params)

    def _sync_pre(self, opt: torch.optim.Optimizer, args: tuple[object, ...],
                  kwargs: dict[str, object]) -> None:
        """The optimizer's own pre-hook, outside the observer: every rank joins the check's
        all-gather at the same steps even after accumguard failed on one of them (that rank
        sends a marker and every rank drops the check instead of waiting for ever)."""
        self._sync_steps += 1
        if (self._sync_off or self._sync_failsafe is None
                or self._sync_steps % (self.check_sync_every or 1)):
            return
        obs = self.observer
        paused = obs.counter.paused() if obs is not None else contextlib.nullcontext()
        with paused:
            table = gather_rows(self._sync_failsafe, self._local_checksum, world=self._world,
                                device=self._sync_device(), where="the guard's cross-rank check")
        if table is None:
            self._sync_off = True
            warnings.warn(AccumguardWarning(
                f"{rank_prefix(self._rank)}accumguard failed on a rank (see its stderr): the "
                "guard's cross-rank gradient check is off from here on; the run is unchanged"),
                stacklevel=2)
            return
        self._compare_ranks(torch.cat(table))

    def _local_checksum(self) -> torch.Tensor:
        if self.failure is not None:  # this rank's observation failed: say so to the others
            raise RuntimeError(f"observation off on this rank: {self.failure.error}")
        with torch.no_grad():
            local: torch.Tensor = checksums(self.targets.params)[:, [0, 2]].sum(0, keepdim=True)
        return local

    def _sync_device(self) -> torch.device:
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _compare_ranks(self, table: torch.Tensor) -> None:
        ref = table[0]
        tol = 1e-9 * float(ref.abs().max()) + 1e-30
        if float((table - ref).abs().max()) > tol:
            self.desync(", ".join(f"rank {r}: {float(row[1]):.9g}" for r, row in enumerate(table)))


def guard(model: torch.nn.Module, optimizer: object, *, accumulation_steps: int,
          scheduler: object = None, scaler: torch.amp.GradScaler | None = None,
          mode: str = "raise",
          sync: str = "deferred", total_micro_batches: int | None = None,
          check_sync_every: int | None = None) -> AccumulationGuard:
    """Build an :class:`AccumulationGuard`; use it as ``with guard(...):`` or call
    ``.install()`` / ``.close()``. See the class for the arguments."""
    return AccumulationGuard(model, optimizer, accumulation_steps=accumulation_steps,
                             scheduler=scheduler, scaler=scaler, mode=mode, sync=sync,
                             total_micro_batches=total_micro_batches,
                             check_sync_every=check_sync_every)


def _scaler_enabled(scaler: object) -> bool:
    is_enabled = getattr(scaler, "is_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True


def _dist_info() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _true() -> bool:
    """``grads_set`` when the leak check found gradients left from the previous step."""
    return True
