"""The contract every engine adapter fulfils.

An adapter translates the Accumulator's four questions into one engine's API:

1. *How do I run a micro-step?* :meth:`Engine.micro_step` returns the context
   that forward **and** backward run in (DDP's ``no_sync`` must span the
   forward, or the next backward syncs anyway: failure class F11).
2. *What does your reduction do to gradients?* :meth:`Engine.reduction` is
   data (:class:`~accumguard.core.scaling.GradReduction`); the Accumulator composes
   it with K, N and W in :func:`~accumguard.core.scaling.loss_scale`.
3. *What happens at the boundary?* :meth:`sync`, :meth:`clip_grad_norm`,
   :meth:`optimizer_step`, :meth:`zero_grad`, called in that order.
4. *How many gradient collectives did you issue?* :meth:`grad_collectives`.

To add an engine: subclass :class:`Engine` in a new module of this package,
implement the abstract methods, and register it in :mod:`accumguard.engines.registry`
(or, from another package, through the ``accumguard.engines`` entry-point group).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

from accumguard.core.scaling import GradReduction

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from accumguard.engines.precision import MainGrads, MasterWeights

__all__ = ["Engine", "Scheduler", "any_nonfinite", "dist_info", "group_or_world"]


class Scheduler(Protocol):
    """An LR scheduler as the accumulation drives it: one ``step()`` per optimizer step
    (torch's ``LRScheduler``, or a framework's wrapper of one), and its state for a
    checkpoint."""

    def step(self) -> object: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def any_nonfinite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """0-d bool tensor: True when an element of ``tensors`` is NaN or ±Inf, with no host sync.

    Built on the largest and smallest element (never overflows for finite values, unlike a
    sum or a 2-norm; NaN propagates). On CPU one ``aminmax`` per tensor: torch's fused
    ``_foreach_norm(..., inf)`` has no fast CPU kernel (40 ms against 3 ms for a 6.3 M-element
    MLP, 2026-11-30: 15 % of a DDP step in ``accumguard bench``); elsewhere the fused kernel
    is one launch for all tensors.
    """
    tensors = [t for t in tensors if t.numel() > 0]
    if not tensors:
        return torch.zeros((), dtype=torch.bool)
    if all(t.device.type == "cpu" for t in tensors):
        ends = torch.stack([x.float() for t in tensors for x in torch.aminmax(t)])
        return ~torch.isfinite(ends).all()
    maxes = torch._foreach_norm(tensors, float("inf"))
    return ~torch.isfinite(torch.stack([m.float() for m in maxes]).max())


def dist_info(process_group: ProcessGroup | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` in ``process_group``, or ``(0, 1)`` outside torch.distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def group_or_world(group: ProcessGroup | None) -> ProcessGroup:
    """``group``, or torch.distributed's default (world) group when None."""
    import torch.distributed as dist

    pg = group if group is not None else dist.group.WORLD
    assert pg is not None, "torch.distributed is not initialised"
    return pg


class Engine(ABC):
    """One training engine, driven by the Accumulator through a fixed protocol.

    Subclasses set ``name`` and ``sync_mode`` ("deferred": one gradient
    reduction per window; "eager": one per micro-step; "none": single process).
    """

    name: str = "engine"
    sync_mode: str = "none"
    #: True when the engine holds the optimizer itself (DeepSpeed): the caller passes none.
    owns_optimizer: bool = False

    def __init__(self, model: torch.nn.Module, *,
                 process_group: ProcessGroup | None = None) -> None:
        self.model = model
        self.process_group = process_group
        self.rank, self.world_size = dist_info(process_group)

    # -- lifecycle ---------------------------------------------------------
    def bind(self, optimizer: torch.optim.Optimizer | None, accumulation_steps: int) -> None:  # noqa: B027
        """Called once by the Accumulator before the first micro-step."""

    def check_options(self, *, max_grad_norm: float | None,  # noqa: B027
                      scaler: torch.amp.GradScaler | None = None,
                      scheduler: Scheduler | None = None) -> None:
        """Called once by the Accumulator after :meth:`bind`: raise ConfigError for options
        this engine cannot honour (e.g. DeepSpeed clips and scales losses itself)."""

    def abort_window(self, optimizer: torch.optim.Optimizer | None) -> None:
        """An exception left the window unfinished: discard its partial gradients."""
        if self.main_grads is not None:
            self.main_grads.discard()
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Restore every engine setting this adapter changed (previous values, not defaults);
        here: hand the optimizer its own parameters back and drop the fp32 buffers."""
        if self.master_weights is not None:
            self.master_weights.close()
            self.master_weights = None
        if self.main_grads is not None:
            self.main_grads.close()
            self.main_grads = None

    # -- precision of the window's gradient sum --------------------------------------
    #: fp32 main-gradient buffers, when this adapter accumulates in fp32 itself (local, DDP).
    main_grads: MainGrads | None = None
    #: fp32 master weights (``Accumulator(..., master_weights=True)``), set by
    #: :func:`accumguard.engines.precision.enable_master_weights` (local, DDP).
    master_weights: MasterWeights | None = None

    def set_accumulation_dtype(self, mode: str) -> str:
        """Called once by the Accumulator (``accumulation_dtype=...``, see
        :mod:`accumguard.engines.precision`); returns the dtype the window's gradients are
        summed in (``"float32"`` or a low-precision dtype name) for logs and reports.

        Default, for engines that do not say: nothing is changed, and ``"float32"`` is refused
        when trainable parameters are bf16/fp16 (the sum would silently stay in low precision).
        """
        from accumguard.core.errors import ConfigError
        from accumguard.engines.precision import low_precision_params

        low = low_precision_params(self.model.parameters())
        if low and mode == "float32":
            raise ConfigError(
                f"accumulation_dtype='float32' was asked for, but the {self.name} engine "
                f"adapter cannot sum the gradients of its {low[0].dtype} parameters in fp32; "
                "use accumulation_dtype='native' (accepting low-precision sums) or fp32 "
                "parameters with autocast")
        return str(low[0].dtype).removeprefix("torch.") if low else "float32"

    def _enable_main_grads(self, mode: str) -> str:
        """fp32 main-gradient buffers for engines whose gradients live in ``p.grad`` of the
        model's own parameters (local, DDP): on for ``"float32"``, and for ``"auto"`` when a
        trainable parameter is bf16/fp16."""
        from accumguard.engines.precision import MainGrads, low_precision_params

        low = low_precision_params(self.model.parameters())
        if not low:
            return "float32"
        if mode == "native":
            return str(low[0].dtype).removeprefix("torch.")
        if self.main_grads is None:
            self.main_grads = MainGrads([p for p in self.model.parameters() if p.requires_grad])
        return "float32"

    @property
    def device(self) -> torch.device:
        """Where small bookkeeping tensors (counts) must live for this engine's collectives."""
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    # -- the four questions ----------------------------------------------------
    @abstractmethod
    def reduction(self) -> GradReduction:
        """What the engine's reduction does to gradients (as data, for :func:`loss_scale`)."""

    @contextlib.contextmanager
    def micro_step(self, *, is_last: bool) -> Iterator[None]:
        """Context that a micro-step's forward and backward both run in."""
        yield

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate an already scaled loss."""
        loss.backward()  # type: ignore[no-untyped-call]

    def sync(self) -> None:  # noqa: B027
        """Finish any gradient reduction still pending at the boundary."""

    def parameters_with_grad(self) -> list[torch.Tensor]:
        if self.master_weights is not None:  # the optimizer steps the masters: their grads
            masters: list[torch.Tensor] = self.master_weights.parameters_with_grad(
                self.model.parameters())
            return masters
        return [p for p in self.model.parameters() if p.grad is not None]

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip by the *global* norm of the synchronised gradient; return the norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(self.parameters_with_grad(), max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer | None,
                       scaler: torch.amp.GradScaler | None = None) -> None:
        """Step ``optimizer`` (through ``scaler``). It is None only for an engine that owns
        its optimizer (:attr:`owns_optimizer`, which overrides this); the Accumulator refuses
        a None optimizer for every other engine."""
        assert optimizer is not None
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()

    def zero_grad(self, optimizer: torch.optim.Optimizer | None) -> None:
        """None only for an engine that owns its optimizer (see :meth:`optimizer_step`)."""
        assert optimizer is not None
        optimizer.zero_grad(set_to_none=True)

    # -- non-finite values ------------------------------------------------------
    def nonfinite_grads(self, norm: torch.Tensor | None) -> torch.Tensor | None:
        """After :meth:`sync` (and clipping): a 0-d bool tensor, True when the synchronised
        gradient holds a NaN/Inf, **identical on every rank** (the Accumulator branches on
        it, so ranks must agree or the next collective hangs). ``None``: the engine decides
        inside :meth:`optimizer_step` itself and :meth:`step_applied` reports it.

        Default: replicated gradients (plain process, DDP, ZeRO-1: after DDP's all-reduce
        every rank holds the same bits, and a NaN on any rank's gradient reaches all of
        them). ``norm`` is the clipping norm when clipping ran (global by contract), so
        it is reused and nothing else is computed. Otherwise the max-abs over gradients:
        it never overflows for finite values and propagates NaN, and needs no collective.
        """
        if norm is not None:
            return ~torch.isfinite(torch.as_tensor(norm))
        return any_nonfinite([p.grad.detach() for p in self.parameters_with_grad()
                              if p.grad is not None])

    @property
    def dynamic_loss_scale(self) -> bool:
        """True when the engine scales losses dynamically (fp16), so that an overflow-skipped
        step is routine rather than a sign of broken numerics."""
        return False

    def step_applied(self) -> bool:
        """Whether the last :meth:`optimizer_step` changed the parameters (``False`` when the
        engine skipped it on its own, e.g. DeepSpeed on a gradient overflow)."""
        return True

    def skip_detail(self) -> str:
        """Why the engine skipped the last step (after ``step_applied()`` returned False)."""
        return "the engine skipped the optimizer step"

    def grad_collectives(self) -> int | None:
        """Gradient collectives issued so far, or ``None`` if this engine cannot count them."""
        return 0 if self.world_size == 1 else None

    def describe(self) -> str:
        return f"{self.name} (sync={self.sync_mode}, world={self.world_size})"
