"""What the observation layer reports: one dataclass per event kind, and the listener
protocol that the guard and ``watch`` implement."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol

from accumguard.core.window import Conservation, StepRecord

if TYPE_CHECKING:
    import torch

    from accumguard.observe._failsafe import Failure

__all__ = ["BackwardEvent", "EngineInfo", "EngineStepEvent", "ForwardEvent", "Listener",
           "ScalerEvent", "StepEvent", "StepStartEvent", "ZeroGradEvent", "SchedulerEvent",
           "ClipEvent", "CollectiveEvent", "Handlers", "OptimizerCallEvent"]


@dataclass
class ForwardEvent:
    """A forward of a watched (root) module with grad enabled."""

    step: int
    micro: int  # backward passes so far in the window
    engine: str  # "ddp" | "fsdp2" | "deepspeed" | "local"
    sync: bool | None  # DDP/FSDP2 gradient-sync flag at forward (None: not applicable)
    module: torch.nn.Module | None = field(repr=False, default=None)


@dataclass
class BackwardEvent:
    """One backward pass (the outermost ``Tensor.backward``/``autograd.backward``/
    ``engine.backward``/``accelerator.backward`` call)."""

    step: int
    micro: int  # 0-based position in the window
    source: str
    loss: float | None = None
    sync_forward: bool | None = None  # DDP/FSDP2 flag at the forward feeding this backward
    sync_backward: bool | None = None  # the flag when backward began
    engine: str = "local"
    reductions: int = 0  # gradient-reducing collectives issued inside this backward
    ds_boundary: bool | None = None  # DeepSpeed: engine boundary flag at this backward
    ds_coalescing: bool = False  # DeepSpeed: inside coalesce_grad_reduction / no_sync
    # DeepSpeed ZeRO: the optimizer's micro_step_id at this backward (ZeRO-3 advances it in
    # engine.forward; a backward at the same id as the one before copies over its gradient)
    ds_micro_id: int | None = None
    forwards: int = 0  # watched forwards since the previous backward
    new_pass: bool = False  # a pass over a DataLoader began since the previous backward
    # attribution (``Observer(attribute=True)``): True when this backward reached the output
    # of a watched root's forward, False when it did not (another model's loss), None unknown
    reached: bool | None = None


@dataclass
class ZeroGradEvent:
    step: int
    micro: int
    kind: str  # "optimizer" | "module"
    owner: torch.optim.Optimizer | torch.nn.Module | None = field(repr=False, default=None)


@dataclass
class SchedulerEvent:
    step: int
    micro: int
    count: int  # this scheduler's steps so far (not counting the constructor's)
    optimizer_steps: int  # steps of the scheduler's optimizer so far
    in_step: bool  # inside an engine/optimizer step (DeepSpeed steps its own scheduler)
    # torch's LRScheduler or a framework's wrapper of one (Accelerate's): read by identity
    # and ``getattr`` only
    owner: object = field(repr=False, default=None)
    # its optimizer had not stepped yet (``optimizer_steps`` is then the process's): a
    # scheduler made for a resume and fast-forwarded before the first step
    fresh: bool = False


@dataclass
class ClipEvent:
    step: int
    micro: int
    function: str
    params: list[torch.Tensor] = field(repr=False, default_factory=list)


@dataclass
class EngineInfo:
    """The configuration an engine really runs with (DeepSpeed: read from the engine)."""

    engine: str
    zero_stage: int | None = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    clipping_set_by_user: bool | None = None
    requested_clipping: float | None = None  # the HF Trainer's max_grad_norm, when one ran
    managed_accumulation: bool | None = None
    micro_batch: int | None = None
    #: [key, K]: the config asked for K > 1 under a key DeepSpeed does not read
    #: (:func:`accumguard.static.dsconfig.ignored_accumulation`), so the engine runs GA 1
    ignored_accumulation: list[object] | None = None


#: One optimizer step as the observation layer reports it (``on_step``): the one window
#: record of :mod:`accumguard.core.window`, with the update tensors when they were asked for.
#: (Outermost: an inner optimizer stepped by an engine or a wrapper is part of its caller's
#: step. ``applied`` is False when every gradient was None or the engine skipped the update;
#: ``discarded``: a GradScaler skipped the step, so the window's gradients are dropped.)
StepEvent = StepRecord


@dataclass
class StepStartEvent:
    """An optimizer step about to run (``on_step_start``; a listener may raise to stop it).

    ``owner`` is the torch optimizer (outermost) or the DeepSpeed engine that steps;
    ``conservation`` the verdict on the gradient it is about to receive (None when the
    window was not checked)."""

    step: int
    backwards: int
    source: str  # "torch" | "deepspeed"
    applied: bool  # False: every gradient of the optimizer is None (a no-op step)
    engine: str = "local"
    conservation: Conservation | None = None
    # the torch optimizer, or the DeepSpeed engine (an ``nn.Module``)
    owner: object = field(repr=False, default=None)
    # the step runs inside a backward pass (an optimizer stepped from a gradient hook)
    in_backward: bool = False


@dataclass
class EngineStepEvent:
    """A DeepSpeed ``engine.step()`` call, boundary or not (``on_engine_step``, before it
    runs); ``backwards``: backward passes since the previous ``engine.step()`` call."""

    step: int
    boundary: bool
    backwards: int
    owner: torch.nn.Module | None = field(repr=False, default=None)  # the DeepSpeed engine


@dataclass
class ScalerEvent:
    """``GradScaler.unscale_`` (``on_unscale``, before) or ``GradScaler.update``
    (``on_scaler_update``, after); outermost calls only. ``on_scaler_skip``: a
    ``GradScaler.step`` that skipped the optimizer (inf/NaN gradients); ``owner`` is then
    the optimizer it was given, ``step`` the window it ended."""

    step: int
    micro: int
    kind: str  # "unscale" | "update" | "skip"
    owner: object = field(repr=False, default=None)  # the GradScaler, or (skip) the optimizer


@dataclass
class OptimizerCallEvent:
    """Every torch optimizer ``step()`` call, nested or not (``on_optimizer_call``, before
    it runs): the moment an optimizer receives its gradient. ``depth`` 1 is the outermost
    torch step; ``in_engine`` is True inside DeepSpeed's ``engine.step`` (whose inner
    optimizer may step once per parameter group). The audit copies the gradient here."""

    step: int
    depth: int
    in_engine: bool
    owner: torch.optim.Optimizer | None = field(repr=False, default=None)


@dataclass
class CollectiveEvent:
    """One outermost collective call (``on_collective``, before it runs); ``in_engine``:
    inside DeepSpeed's ``engine.step`` (its norm/overflow all-reduces)."""

    step: int
    op: str
    reduces: bool
    in_engine: bool


class Listener(Protocol):
    """What a listener may implement: any subset of the methods of :class:`Handlers` (each
    is looked up with ``getattr`` when the listener is added). ``on_step`` is the one every
    listener of the observer has."""

    def on_step(self, event: StepEvent) -> None: ...


@dataclass
class Handlers:
    """The listeners' bound methods, one typed list per event kind, collected once when a
    listener is added (the hot paths test a list and call what is in it). A listener
    implements any subset; each method may raise to stop the action it is told about
    (``on_step_start``, ``on_backward_start``, ``on_zero_grad``, ``on_scheduler_step``,
    ``on_clip``: the guard does)."""

    on_forward: list[Callable[[ForwardEvent], object]] = field(default_factory=list)
    on_backward_start: list[Callable[[BackwardEvent], object]] = field(default_factory=list)
    on_backward: list[Callable[[BackwardEvent], object]] = field(default_factory=list)
    on_collective: list[Callable[[CollectiveEvent], object]] = field(default_factory=list)
    on_optimizer_call: list[Callable[[OptimizerCallEvent], object]] = field(
        default_factory=list)
    on_step_start: list[Callable[[StepStartEvent], object]] = field(default_factory=list)
    on_step: list[Callable[[StepEvent], object]] = field(default_factory=list)
    on_engine_step: list[Callable[[EngineStepEvent], object]] = field(default_factory=list)
    on_engine: list[Callable[[EngineInfo], object]] = field(default_factory=list)
    on_zero_grad: list[Callable[[ZeroGradEvent], object]] = field(default_factory=list)
    on_scheduler_step: list[Callable[[SchedulerEvent], object]] = field(default_factory=list)
    on_clip: list[Callable[[ClipEvent], object]] = field(default_factory=list)
    on_unscale: list[Callable[[ScalerEvent], object]] = field(default_factory=list)
    on_scaler_update: list[Callable[[ScalerEvent], object]] = field(default_factory=list)
    on_scaler_skip: list[Callable[[ScalerEvent], object]] = field(default_factory=list)
    on_internal_error: list[Callable[[Failure], object]] = field(default_factory=list)
    # observation ends on purpose after this many optimizer steps (``observe_steps``)
    on_retire: list[Callable[[int], object]] = field(default_factory=list)

    @classmethod
    def of(cls, listeners: Iterable[object]) -> Handlers:
        """Every listener's methods, by event kind, in the order the listeners came."""
        found = cls()
        for kind in fields(cls):
            methods = getattr(found, kind.name)
            for listener in listeners:
                fn = getattr(listener, kind.name, None)
                if fn:
                    methods.append(fn)
        return found

    def __getitem__(self, kind: str) -> Sequence[object]:
        """The methods for ``kind`` by name (for a caller that only tests whether any
        listener wants a kind)."""
        methods: Sequence[object] = getattr(self, kind)
        return methods
