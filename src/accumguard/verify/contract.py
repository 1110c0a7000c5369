"""The contract between a user's training loop and the audit.

To audit the loop you actually run, you give two things:

* an :class:`AuditSetup`: how to build the model, optimizer, scheduler and this
  rank's micro-batches deterministically, the loss as ``(sum, count)``, K and
  the clipping you use. The audit builds the single-process reference from the
  same setup, so it sees exactly the data and weights your loop sees.
* a *loop*: ``loop(ctx: LoopContext) -> None``, your training loop, run on
  every rank. It wraps ``ctx.model`` however you do in production (DDP, FSDP2,
  DeepSpeed, Accelerate, nothing), creates the optimizer with
  ``ctx.make_optimizer``, and trains over ``ctx.batches``. The audit observes
  it from outside (optimizer-step hooks, collective counters), so the loop needs
  no accumguard call at all.

A plain DDP loop under audit, as an example of the glue a user writes::

    def my_loop(ctx):
        model = DistributedDataParallel(ctx.model)
        opt = ctx.make_optimizer(model.parameters())
        for i, batch in enumerate(ctx.batches):
            last = (i + 1) % ctx.accumulation_steps == 0 or i + 1 == len(ctx.batches)
            with (contextlib.nullcontext() if last else model.no_sync()):
                loss, n = ctx.loss_fn(model, batch)
                (loss / n / ctx.accumulation_steps).backward()   # F5: mean of means
            if last:
                opt.step(); opt.zero_grad()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, get_args

import torch

from accumguard.core.boundary import check_accumulation_steps
from accumguard.core.errors import ConfigError
from accumguard.verify.report import Precision

__all__ = ["AuditSetup", "LoopContext", "Loop"]


@dataclass(frozen=True, kw_only=True)
class AuditSetup:
    """Everything needed to rebuild a training run deterministically on any rank.

    ``build_model()`` must return the same weights on every call (seed inside
    it). ``rank_batches(rank, world_size)`` returns that rank's micro-batches in
    the order the loop consumes them. ``loss_fn(model, batch)`` returns the
    **sum** of per-sample/per-token losses and the count. Must be picklable
    (module-level functions), because ranks are separate processes.

    ``epochs``: how many passes the loop makes over ``rank_batches`` (the same
    micro-batches in the same order each pass). Windows restart at every epoch: the
    reference steps on ``ceil(M/K)`` windows per epoch, the last one partial.

    ``precision``: the dtype the loop *computes* in (forward/backward): ``"auto"``
    detects autocast, FSDP2 ``MixedPrecisionPolicy`` and low-precision parameters;
    declare ``"bf16"``/``"fp16"`` for what cannot be seen from outside (a bf16
    working copy of fp32 master weights). Gradients are expected to be
    *accumulated* in fp32 (in the parameters' dtype for a model that is bf16
    throughout); the tolerance follows (``accumguard.verify.tolerance``).
    """

    build_model: Callable[[], torch.nn.Module]
    make_optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    rank_batches: Callable[[int, int], list[Any]]
    loss_fn: Callable[[torch.nn.Module, Any], tuple[torch.Tensor, Any]]
    accumulation_steps: int
    make_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    max_grad_norm: float | None = None
    count_fn: Callable[[Any], Any] | None = None
    epochs: int = 1
    precision: Precision = "auto"

    def __post_init__(self) -> None:
        check_accumulation_steps(self.accumulation_steps)
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise ConfigError(f"AuditSetup.epochs ({self.epochs!r}) must be a positive int: the "
                              "number of passes the loop makes over rank_batches")
        if self.precision not in get_args(Precision):
            raise ConfigError(f"AuditSetup.precision ({self.precision!r}) must be one of "
                              f"{', '.join(get_args(Precision))}: the dtype the loop computes in")
        for name in ("build_model", "make_optimizer", "rank_batches", "loss_fn"):
            if not callable(getattr(self, name)):
                raise ConfigError(f"AuditSetup.{name} must be callable, got "
                                  f"{type(getattr(self, name)).__name__}")


@dataclass
class LoopContext:
    """What a loop under audit receives on each rank.

    ``model`` is a fresh ``setup.build_model()`` (already observed: do not
    rebuild it, wrap it), already moved to ``device``. ``batches`` is this rank's
    data, possibly cut to the audited number of steps, its tensors on ``device``.
    ``device`` is where this rank computes: ``cuda:LOCAL_RANK`` under nccl, the CPU
    under gloo (:func:`accumguard.runtime.launch.rank_device`); create any tensor a
    collective sees (a token count to all-reduce) there, since NCCL has no CPU path.
    The model is built on the CPU and then moved, so its weights are bit-identical to
    the reference's, which stays on the CPU in fp64. Compute losses with :meth:`loss_fn` when you can:
    the audit then records the loss your loop actually saw (for loss curves);
    a loop that computes the loss itself still works, the report then shows
    the reference loss instead.
    """

    rank: int
    world_size: int
    setup: AuditSetup
    model: torch.nn.Module
    batches: list[Any]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # Called with (loss_sum, count) after every ``loss_fn``; set by the audit's observer.
    on_loss: Callable[[torch.Tensor, Any], None] | None = field(default=None, repr=False)

    @property
    def accumulation_steps(self) -> int:
        return self.setup.accumulation_steps

    @property
    def epochs(self) -> int:
        """Passes over ``batches`` the loop is expected to make (``setup.epochs``)."""
        return self.setup.epochs

    @property
    def max_grad_norm(self) -> float | None:
        return self.setup.max_grad_norm

    def make_optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return self.setup.make_optimizer(params)

    def make_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        return None if self.setup.make_scheduler is None else self.setup.make_scheduler(optimizer)

    def loss_fn(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, Any]:
        """``setup.loss_fn(model, batch)``: the summed loss and its count, recorded for the report."""
        out = self.setup.loss_fn(model, batch)
        if self.on_loss is not None:
            self.on_loss(*out)
        return out


Loop = Callable[[LoopContext], None]
