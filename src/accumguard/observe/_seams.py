"""What the patch modules need from the observer, and what observe reads from DeepSpeed.

The patches (:mod:`._patch_torch`, :mod:`._patch_deepspeed`, :mod:`._patch_accelerate`,
:mod:`._patch_trainers`) run inside the user's calls and work on the observer's counters
directly (one attribute lookup per call, no method in between: they are hot paths).
:class:`PatchHost` names exactly that surface, so a patch module depends on it and not on
:class:`~._observer.Observer` (importing the class would make an import cycle, which
tests/test_layers.py refuses); the observer satisfies it structurally, checked where it
hands itself to ``install``/``patch_*``.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Protocol, cast

import torch

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from accumguard.observe._boundary import BoundaryScale
    from accumguard.observe._collectives import CollectiveCounter
    from accumguard.observe._events import BackwardEvent, EngineInfo, Handlers
    from accumguard.observe._failsafe import Failsafe, Original
    from accumguard.observe._lanes import Lanes
    from accumguard.observe._lr_trace import LrTrace
    from accumguard.observe._patch import Patches
    from accumguard.observe._tally import Tally
    from accumguard.observe._window import StepTally

__all__ = ["DeepSpeedEngine", "EngineHost", "LossHost", "PatchHost", "as_deepspeed"]


class DeepSpeedEngine(Protocol):
    """The part of ``deepspeed.runtime.engine.DeepSpeedEngine`` observe calls (DeepSpeed is
    never imported here; every read is wrapped in ``contextlib.suppress`` by the caller, so
    a version without one of these leaves the fact unknown)."""

    def is_gradient_accumulation_boundary(self) -> bool: ...
    def gradient_clipping(self) -> float | None: ...
    def zero_optimization_stage(self) -> int: ...
    def gradient_accumulation_steps(self) -> int: ...
    def train_micro_batch_size_per_gpu(self) -> int: ...
    def get_global_grad_norm(self) -> float | torch.Tensor | None: ...
    def get_data_types(self) -> tuple[torch.dtype, torch.dtype]: ...


def as_deepspeed(engine: torch.nn.Module) -> DeepSpeedEngine:
    """A module :func:`~._introspect.engine_kind` named ``deepspeed`` (or the ``self`` of a
    patched ``DeepSpeedEngine`` method), seen as the engine API above: to the checker a
    DeepSpeed engine is only the ``nn.Module`` it subclasses."""
    return cast("DeepSpeedEngine", engine)


class EngineHost(Protocol):
    """Where :func:`~._patch_deepspeed.note_engine` leaves a DeepSpeed engine's
    configuration (the forward side calls it too, for an engine seen first as a root)."""

    engine_info: EngineInfo | None
    trainer_clip: float | None
    _handlers: Handlers


class LossHost(Protocol):
    """The observer as the loss recorder sees it: whether it observes, the backward it is
    in, its listeners and its fail-safe door."""

    installed: bool
    failsafe: Failsafe
    _bw_current: BackwardEvent | None
    _handlers: Handlers

    def _active(self) -> bool: ...


class PatchHost(EngineHost, Protocol):
    """The observer as the patch modules see it: lifecycle flags, the re-entrancy depths
    they count, the window, and the bookkeeping calls they make."""

    # lifecycle and shared services
    installed: bool
    auto_roots: bool
    patches: Patches
    failsafe: Failsafe
    counter: CollectiveCounter
    lanes: Lanes
    lr_trace: LrTrace
    boundary: BoundaryScale | None
    roots: dict[int, torch.nn.Module]
    # per DDP wrapper built under observation: its parameters frozen when it was built
    ddp_frozen: MutableMapping[object, frozenset[int]]
    # the window and the run's counts
    step: int
    backward_total: int
    _w: StepTally
    # what the frameworks declare (K per library; DeepSpeed's configuration: EngineHost)
    declared_k: dict[str, int]
    k_changes: list[list[int]]  # [backwards so far, K]: a framework changing K mid-run
    k_changes_by: str  # who changed it (Lightning's GradientAccumulationScheduler, the script)
    accelerate_k_from: int  # backwards before Accelerate's K > 1 was first seen (-1: not yet)
    state_loads: list[int]  # the optimizer step of each Optimizer.load_state_dict (a resume)
    frameworks: list[str]
    # Accelerate's backwards with K > 1 and windows closed at a pass's end: [inside a
    # DataLoader it prepared, outside any]
    accelerate_loader: list[int]
    _bw_current: BackwardEvent | None  # the backward pass running, if one is observed
    # re-entrancy: >0 inside the observer's own work or inside an outer call of a kind
    _in_observer: int
    _bw_depth: int
    _opt_depth: int
    _ds_step_depth: int
    _zero_depth: int
    _sched_depth: int
    _accel_sched_inner: int
    _scaler_depth: int
    _clip_depth: int
    _opt_steps: Tally  # optimizers seen stepping, and their steps
    _in_data_pass: int
    _pass_len: int | None
    # auto_roots: the global forward pre-hook, then the pinned per-root ones
    _global_handle: RemovableHandle | None
    _pinned: list[RemovableHandle]
    _pinned_any: bool

    def _global_pre(self, module: torch.nn.Module, args: tuple[object, ...]) -> None: ...
    def _pin_module(self, module: torch.nn.Module, *, depth: bool) -> None: ...
    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple[object, ...],
                 kwargs: dict[str, object]) -> None: ...
    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple[object, ...],
                  kwargs: dict[str, object]) -> None: ...
    def _add_root(self, module: torch.nn.Module) -> None: ...
    def accelerate_block(self, counter: object) -> None: ...
    def _run_backward(self, source: str, loss: object, engine: torch.nn.Module | None,
                      fn: Original, args: tuple[object, ...],
                      kwargs: dict[str, object]) -> object: ...
    def _begin_step(self, opt: object, applied: bool,
                    engine: torch.nn.Module | None = None) -> None: ...
    def _end_step(self, source: str, opt_name: str, applied: bool, norm: float | None,
                  owner: object, *,
                  discarded: bool = False, state_init: bool = False) -> None: ...
    def _skipped_step(self, opt: torch.optim.Optimizer) -> None: ...
    def _state_init_step(self, opt: torch.optim.Optimizer) -> None: ...
    def _count_sched(self, sched: object, positioned: bool = False) -> None: ...
    def _perturbed(self) -> bool: ...
    def _restart_window(self) -> None: ...
