"""The torch-facing Accumulator: exact gradient accumulation on any engine.

A micro-batch flows like this::

    data iterator ──prefetch K──▶ Window (counts known, one all-gather of counts)
        └─▶ MicroStep (engine context: no_sync/... spans forward AND backward)
              └─▶ backward(loss_sum) ── scaled by loss_scale(engine data, N) ──▶ engine.backward
        last MicroStep exits ──▶ Boundary fires once:
              engine.sync → scaler.unscale_ → clip → optimizer step → scaler.update
              → scheduler.step → zero_grad

Typical use (``loss_fn`` returns the *sum* of per-sample losses)::

    acc = Accumulator(model, optimizer, accumulation_steps=4, scheduler=sched, max_grad_norm=1.0)
    for window in acc.windows(loader):
        for micro in window:
            with micro:
                micro.backward(loss_sum_fn(model, micro.batch))

Size (~910 lines): the Accumulator, its Window and MicroStep and their input validation form one state machine whose invariants are easiest to read together. Known debt: input validation and the non-finite policy should move to their own modules.
"""

from __future__ import annotations

import logging
import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from accumguard.core.boundary import Boundary, check_accumulation_steps
from accumguard.core.errors import (
    AccumguardWarning,
    ConfigError,
    DistributedError,
    NonFiniteError,
    UsageError,
    rank_prefix,
)
from accumguard.core.scaling import GradReduction, loss_scale
from accumguard.engines import Engine, resolve_engine
from accumguard.engines.precision import (
    AccumulationDtype,
    MasterWeights,
    enable_master_weights,
    load_master_state,
)

__all__ = ["AccumulationConfig", "Accumulator", "MicroStep", "NonFinitePolicy", "StepResult",
           "Window", "batch_size"]

log = logging.getLogger("accumguard")

_STATE_VERSION = 1
_STATE_KEYS = ("version", "accumulation_steps", "normalization", "windows_seen",
               "optimizer_steps", "skipped_windows", "micro_batches_consumed")

#: What a window with a NaN/Inf loss or gradient does: ``"skip"`` it on every rank (no
#: optimizer step, scheduler held, gradients discarded, a warning) or ``"raise"``
#: :class:`~accumguard.core.errors.NonFiniteError` (after discarding it the same way).
NonFinitePolicy = Literal["skip", "raise"]


def batch_size(batch: Any) -> int:
    """Samples in a micro-batch: the leading dimension of its first tensor.

    The default ``count_fn``. For token-level losses pass your own, e.g.
    ``count_fn=lambda b: (b["labels"] != -100).sum()``.
    """
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise ConfigError("a 0-d tensor micro-batch has no sample dimension; pass count_fn")
        return batch.shape[0]
    values: Iterable[Any]
    if isinstance(batch, dict):
        values = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        values = ()
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return v.shape[0]
    raise ConfigError(
        f"cannot tell how many samples a {type(batch).__name__} micro-batch holds; pass "
        "count_fn=... returning the number of samples (or valid tokens) of a micro-batch"
    )


def _check_count(index: int, seen: float, expected: float) -> None:
    if seen != expected:
        raise UsageError(
            f"backward() got count={seen:g} but count_fn reported {expected:g} for this "
            f"micro-batch (micro-step {index}). The window's N is fixed before the first "
            "backward, so pass a count_fn that returns the same count (e.g. valid tokens) to "
            "the Accumulator")


@dataclass(frozen=True)
class _BadCount:
    """A count_fn result that is not a number: carried to the all-gather, raised there."""

    seen: str


def _as_count(x: Any) -> Any:
    """``x`` if it is a usable count (a real number or a 1-element real tensor), else a
    :class:`_BadCount` describing it. Values (negative, NaN) are checked after the gather."""
    if isinstance(x, torch.Tensor):
        if x.numel() == 1 and not (x.is_complex() or x.dtype == torch.bool):
            return x
        return _BadCount(f"a {x.dtype} tensor of shape {tuple(x.shape)}")
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return x
    return _BadCount(f"{x!r:.40} (a {type(x).__name__})")


def _check_callables(**objs: Any) -> None:
    """Catch the common mix-ups (a list of optimizers, a scheduler class, a count that is
    not a function) at construction, instead of as an AttributeError mid-training."""
    needs = {"optimizer": ("step", "zero_grad", "param_groups"), "scheduler": ("step",),
             "scaler": ("scale", "unscale_", "step", "update", "get_scale")}
    for name, obj in objs.items():
        if obj is None:
            continue
        if name == "count_fn":
            if not callable(obj):
                raise ConfigError(f"`count_fn` ({obj!r:.60}) must be a function of a micro-batch "
                                  "returning its number of samples/tokens")
            continue
        missing = [a for a in needs[name] if not hasattr(obj, a)]
        if missing or isinstance(obj, type):
            fix = {"optimizer": "a torch.optim.Optimizer instance (one optimizer; build one "
                                "over all parameters, or param groups)",
                   "scheduler": "an LR scheduler instance, e.g. "
                                "torch.optim.lr_scheduler.LambdaLR(optimizer, ...)",
                   "scaler": "a torch.amp.GradScaler instance"}[name]
            raise ConfigError(f"`{name}` is {obj!r:.60} (a {type(obj).__name__}, missing "
                              f"{missing or ['an instance']}); expected {fix}")


def _check_optimizer_params(model: Any, optimizer: Any) -> None:
    """The optimizer must hold parameters, and some of them must be the model's: otherwise
    every step is a silent no-op on the model being trained."""
    params = [p for g in optimizer.param_groups for p in g.get("params", [])]
    if not params:
        raise ConfigError(
            f"the {type(optimizer).__name__} holds no parameters (empty param_groups); "
            "expected the model's parameters. Build it as Optimizer(model.parameters(), ...)")
    if not isinstance(model, torch.nn.Module):
        return
    mine = {id(p) for p in model.parameters()}
    if mine and not any(id(p) in mine for p in params):
        raise ConfigError(
            f"the {type(optimizer).__name__} holds {len(params)} parameters but none of them "
            "belongs to the model given to the Accumulator, so no step would change it; "
            "expected this model's parameters. Build the optimizer from them (after wrapping it: for FSDP2, after "
            "fully_shard)")


@dataclass(frozen=True, kw_only=True)
class AccumulationConfig:
    """What the Accumulator does, validated once at construction.

    ``normalization="sum"``: the loss you pass to ``backward`` is the **sum**
    over samples/tokens, and the optimizer receives that sum over the whole
    window and all ranks divided by its count N (exact for any mix of sizes).
    ``"mean"``: the loss is already a per-micro-batch mean; valid only when
    every micro-batch of a window has the same size (checked, across ranks).
    """

    accumulation_steps: int
    normalization: str = "sum"
    max_grad_norm: float | None = None
    drop_last_window: bool = False
    nonfinite: NonFinitePolicy = "skip"
    accumulation_dtype: AccumulationDtype = "auto"
    master_weights: bool = False

    def __post_init__(self) -> None:
        check_accumulation_steps(self.accumulation_steps)
        if not isinstance(self.normalization, str) or self.normalization not in ("sum", "mean"):
            raise ConfigError(
                f"`normalization` ({self.normalization!r}) must be 'sum' (loss_fn returns the "
                "sum over samples/tokens; exact for uneven sizes) or 'mean' (equal-size "
                "micro-batches, loss already averaged)"
            )
        if self.max_grad_norm is not None and not (
            isinstance(self.max_grad_norm, (int, float))
            and not isinstance(self.max_grad_norm, bool) and self.max_grad_norm > 0
            and math.isfinite(self.max_grad_norm)
        ):
            raise ConfigError(
                f"`max_grad_norm` ({self.max_grad_norm!r}) must be a positive finite number, "
                "or None to disable clipping"
            )
        if not isinstance(self.drop_last_window, bool):
            raise ConfigError(f"`drop_last_window` ({self.drop_last_window!r}) must be True or "
                              "False")
        if not isinstance(self.nonfinite, str) or self.nonfinite not in get_args(NonFinitePolicy):
            raise ConfigError(
                f"`nonfinite` ({self.nonfinite!r}) must be 'skip' (a window with a NaN/Inf "
                "loss or gradient is skipped on every rank, with a warning) or 'raise' "
                "(NonFiniteError after discarding it)")
        if not isinstance(self.accumulation_dtype, str) or (
                self.accumulation_dtype not in get_args(AccumulationDtype)):
            raise ConfigError(
                f"`accumulation_dtype` ({self.accumulation_dtype!r}) must be 'auto' (sum the "
                "window's gradients in fp32 when parameters are bf16/fp16), 'float32' (the "
                "same, and refuse an engine setup that cannot) or 'native' (sum in the "
                "parameters' dtype, as the engine does by itself)")
        if not isinstance(self.master_weights, bool):
            raise ConfigError(f"`master_weights` ({self.master_weights!r}) must be True or False")
        if self.master_weights and self.accumulation_dtype == "native":
            raise ConfigError(
                "master_weights=True with accumulation_dtype='native': fp32 master weights "
                "step on the window's fp32 gradient sum, which 'native' does not form; use "
                "accumulation_dtype='auto' (default) or 'float32'")


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
        self._ctx: Any = None

    def __enter__(self) -> MicroStep:
        self.window.acc._enter(self)
        return self

    def backward(self, loss: torch.Tensor, count: float | int | torch.Tensor | None = None) -> None:
        """Backpropagate this micro-step's loss (a sum over samples in ``"sum"`` mode).

        ``count``, if given, must equal what ``count_fn`` reported for this batch:
        it is a cross-check, since N had to be known before the first backward.
        """
        self.window.acc._backward(self, loss, count)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.window.acc._exit(self, failed=exc_type is not None)


class Window:
    """The K (or fewer, at the end of data) micro-batches of one optimizer step."""

    def __init__(self, acc: Accumulator, index: int, batches: list[Any], counts: list[float],
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


class Accumulator:
    """Exact gradient accumulation: the optimizer receives Σ g_i / N once per window.

    Args:
        model: the (wrapped) model: plain module, DDP, FSDP2, or a DeepSpeed engine.
        optimizer: its optimizer (``None`` for DeepSpeed, which owns its own).
        accumulation_steps: K, micro-batches per optimizer step and rank.
        engine: ``"auto"`` (infer from the model type), an engine name, or an
            :class:`~accumguard.engines.Engine` instance with custom options.
        scheduler: LR scheduler, stepped once per optimizer step.
        scaler: a ``torch.amp.GradScaler``; unscaled once, at the boundary.
        max_grad_norm: clip the synchronised gradient's global norm at the boundary.
        normalization: ``"sum"`` (default; exact) or ``"mean"``; see :class:`AccumulationConfig`.
        count_fn: samples/tokens of a micro-batch (default: :func:`batch_size`).
        drop_last_window: skip a short final window instead of stepping on it.
        on_boundary: callbacks called with a :class:`StepResult` after each step.
        nonfinite: ``"skip"`` (default) or ``"raise"``: what a window in which any rank
            produced a NaN/Inf loss or gradient does (see :data:`NonFinitePolicy`).
        accumulation_dtype: ``"auto"`` (default: bf16/fp16 gradients are summed over the
            window in fp32: main-gradient buffers on local/DDP, a checked ``reduce_dtype``
            on FSDP2, a checked ``grad_accum_dtype`` on DeepSpeed), ``"float32"`` (required,
            ConfigError with the fix otherwise) or ``"native"``; see
            :mod:`accumguard.engines.precision`. The chosen dtype is ``self.accumulation_dtype``.
        master_weights: ``True``: the optimizer steps fp32 master copies of the bf16/fp16
            parameters with the fp32 window sum (clipping and GradScaler see it too) and the
            model's parameters are their rounded copy (local and DDP; the other engines
            raise ConfigError naming their own way). Build the Accumulator before the
            optimizer holds state. The masters are ``self.masters`` and part of
            :meth:`state_dict`; see :class:`~accumguard.engines.precision.MasterWeights`.
    """

    def __init__(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer | None,
        *,
        accumulation_steps: int,
        engine: str | Engine = "auto",
        scheduler: Any = None,
        scaler: Any = None,
        max_grad_norm: float | None = None,
        normalization: str = "sum",
        count_fn: Callable[[Any], Any] | None = None,
        drop_last_window: bool = False,
        on_boundary: Iterable[Callable[[StepResult], None]] = (),
        nonfinite: NonFinitePolicy = "skip",
        accumulation_dtype: AccumulationDtype = "auto",
        master_weights: bool = False,
    ) -> None:
        self.config = AccumulationConfig(
            accumulation_steps=accumulation_steps, normalization=normalization,
            max_grad_norm=max_grad_norm, drop_last_window=drop_last_window, nonfinite=nonfinite,
            accumulation_dtype=accumulation_dtype, master_weights=master_weights)
        _check_callables(optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                         count_fn=count_fn)
        self.engine = resolve_engine(model, optimizer, engine)
        if optimizer is None and not self.engine.owns_optimizer:
            raise ConfigError(f"optimizer is None, but the {self.engine.name} engine needs the "
                              "optimizer to step; pass it as the second argument")
        if optimizer is not None and not self.engine.owns_optimizer:
            _check_optimizer_params(model, optimizer)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.count_fn = count_fn or batch_size
        if callable(on_boundary):
            on_boundary = (on_boundary,)
        try:
            self.callbacks = list(on_boundary)
        except TypeError:
            raise ConfigError(f"`on_boundary` ({on_boundary!r}) must be a list of callables "
                              "taking a StepResult") from None
        for cb in self.callbacks:
            if not callable(cb):
                raise ConfigError(f"`on_boundary` holds {cb!r}, which is not callable; pass "
                                  "functions taking a StepResult")
        self.engine.bind(optimizer, accumulation_steps)
        self.engine.check_options(max_grad_norm=max_grad_norm, scaler=scaler, scheduler=scheduler)
        #: The dtype the window's gradient sum is kept in ("float32", or e.g. "bfloat16").
        self.accumulation_dtype = self.engine.set_accumulation_dtype(accumulation_dtype)
        #: fp32 master weights of the low-precision parameters (``master_weights=True``).
        self.masters: MasterWeights | None = (
            enable_master_weights(self.engine, optimizer) if master_weights else None)
        self._boundary = Boundary(accumulation_steps, reducer=self.engine.sync,
                                  stepper=self._step)
        self._active: MicroStep | None = None
        self._window: Window | None = None
        self._loss_acc: torch.Tensor | None = None
        self.windows_seen = 0
        self.optimizer_steps = 0
        self.skipped_windows = 0
        self.micro_batches_consumed = 0
        self.history: list[StepResult] = []
        self._logged = False
        self._pending_error: BaseException | None = None

    # -- data --------------------------------------------------------------
    def windows(self, data: Iterable[Any]) -> Iterator[Window]:
        """Group ``data`` into windows of K micro-batches, prefetched so that the window's
        size and sample count (over all ranks) are known before its first backward."""
        if data is None or isinstance(data, (str, bytes)) or not hasattr(data, "__iter__"):
            raise UsageError(
                f"windows() got {type(data).__name__} as data; expected an iterable of "
                "micro-batches (a DataLoader, a list, a generator). Pass your loader")
        it = iter(data)
        k = self.config.accumulation_steps
        first = True
        while True:
            self._check_window_finished()
            batches: list[Any] = []
            for batch in it:
                batches.append(batch)
                if len(batches) == k:
                    break
            counts = [_as_count(self.count_fn(b)) for b in batches]
            local_n, global_n, ranks_n = self._window_stats(batches, counts)
            if first and global_n == 0:
                raise UsageError(
                    "the data iterable yielded no micro-batch on any rank; expected at least "
                    "one. Pass a non-empty loader (a generator can be consumed only once: "
                    "create a new one for each epoch)"
                )
            first = False
            if global_n == 0:
                return
            if local_n == 0 or len(set(ranks_n)) > 1:
                raise DistributedError(
                    f"{self._prefix()}ranks hold different numbers of micro-batches in window "
                    f"{self.windows_seen}: {ranks_n} (rank order). Every rank must run the same "
                    "number of micro-steps or the collectives hang; shard the data evenly, e.g. "
                    "DistributedSampler(drop_last=True) or equal-length per-rank iterators"
                )
            self.micro_batches_consumed += len(batches)
            if len(batches) < k and self.config.drop_last_window:
                log.info("accumguard: dropped the final partial window (%d of %d micro-steps)",
                         len(batches), k)
                self._window = None
                return
            window = self._window
            if window is None:  # pragma: no cover - _window_stats always builds one
                raise UsageError("internal: no window was built for a non-empty batch list")
            if window.skipped:
                self._finish(window, skipped=True, grad_norm=None, lrs=(),
                             reason="the window holds no samples/tokens on any rank (count 0)")
            yield window
            if len(batches) < k:
                return

    def _window_stats(self, batches: list[Any], counts: list[Any]) -> tuple[int, int, list[int]]:
        """One all-gather per window: micro-steps, count, min/max size of every rank.

        Also stores the :class:`Window` being built in ``self._window``.
        """
        dev = self.engine.device
        # A count of the wrong type is reported through the same all-gather (5th entry), so
        # every rank raises together instead of one rank raising and the others hanging.
        bad = next((x for x in counts if isinstance(x, _BadCount)), None)
        if counts:
            c = torch.stack([torch.as_tensor(0.0 if isinstance(x, _BadCount) else x,
                                             dtype=torch.float64, device=dev).reshape(())
                             for x in counts])
            f64 = {"dtype": torch.float64, "device": dev}
            stats = torch.stack([torch.tensor(float(len(batches)), **f64), c.sum(), c.min(),
                                 c.max(), torch.tensor(float(bad is not None), **f64)])
        else:
            stats = torch.tensor([0.0, 0.0, math.inf, -math.inf, 0.0], dtype=torch.float64,
                                 device=dev)
        if self.engine.world_size > 1:
            import torch.distributed as dist

            gathered = [torch.empty_like(stats) for _ in range(self.engine.world_size)]
            dist.all_gather(gathered, stats, group=self.engine.process_group)
            rows = torch.stack(gathered).tolist()
        else:
            rows = [stats.tolist()]
        self._check_counts(rows, bad, counts)
        ranks_n = [int(r[0]) for r in rows]
        global_micro = sum(ranks_n)
        global_count = sum(r[1] for r in rows)
        if global_micro == 0:
            return 0, 0, ranks_n
        if self.config.normalization == "mean":
            sizes = (min(r[2] for r in rows), max(r[3] for r in rows))
            if sizes[0] != sizes[1]:
                raise ConfigError(
                    f"{self._prefix()}normalization='mean' needs equal-size micro-batches, but "
                    f"window {self.windows_seen} has sizes from {sizes[0]:g} to {sizes[1]:g} "
                    "(across micro-steps and ranks). A mean of means weights small batches "
                    "too much (failure class F5). Use normalization='sum' with a loss summed "
                    "over samples, or make all micro-batches equal (DataLoader(drop_last=True))"
                )
        local_counts = [float(x) for x in c.tolist()] if counts else []
        self._window = Window(self, self.windows_seen, batches, local_counts, global_count)
        if global_count == 0:
            warnings.warn(
                f"accumguard: window {self.windows_seen} holds no samples/tokens on any rank "
                "(count 0); its optimizer step is skipped instead of dividing by zero",
                AccumguardWarning, stacklevel=3)
        if not self._logged:
            self._logged = True
            log.info("accumguard: K=%d, %s, normalization=%s, first window: %d micro-steps "
                     "over all ranks, count N=%g", self.config.accumulation_steps,
                     self.engine.describe(), self.config.normalization, global_micro,
                     global_count)
        return len(batches), global_micro, ranks_n

    def _check_counts(self, rows: list[list[float]], bad: _BadCount | None,
                      counts: list[Any]) -> None:
        """Counts must be finite numbers >= 0 on every rank (decided from the gathered rows,
        which are the same on every rank, so all ranks raise together)."""
        multi = len(rows) > 1
        where = (lambda r: f" on rank {r}") if multi else (lambda r: "")
        typed = [r for r, row in enumerate(rows) if row[4] > 0]
        if typed:
            seen = (f"{bad.seen}" if bad is not None else
                    "a value that is not a number")
            raise ConfigError(
                f"{self._prefix()}count_fn returned {seen}{where(typed[0])} in window "
                f"{self.windows_seen}; expected a real number >= 0 (samples or valid tokens "
                "of the micro-batch) or a 1-element tensor. Fix count_fn, e.g. "
                "count_fn=lambda b: (b['labels'] != -100).sum()")
        for r, row in enumerate(rows):
            if row[0] > 0 and (not math.isfinite(row[1]) or row[2] < 0):
                mine = [x for x in counts if not isinstance(x, _BadCount)]
                vals = (f" (this rank's counts: {[float(torch.as_tensor(x)) for x in mine]})"
                        if r == self.engine.rank or not multi else "")
                raise ConfigError(
                    f"{self._prefix()}count_fn returned a negative, NaN or infinite count"
                    f"{where(r)} in window {self.windows_seen}: sum {row[1]:g}, min "
                    f"{row[2]:g}{vals}; expected finite counts >= 0 (N divides the loss: a "
                    "NaN/inf N freezes training, a negative one steps uphill). Fix count_fn")

    # -- micro-steps -----------------------------------------------------------
    def _enter(self, micro: MicroStep) -> None:
        w = micro.window
        if self._active is not None:
            raise UsageError(f"micro-step {micro.index} entered while micro-step "
                             f"{self._active.index} is still open; exit one before entering "
                             "the next")
        if w is not self._window or micro.index != w._entered:
            raise UsageError(
                f"micro-step {micro.index} of window {w.index} entered out of order; iterate "
                "the current window's micro-steps in order, each once")
        self._active = micro
        if micro.index == 0:
            self._loss_acc = None
        micro._ctx = self.engine.micro_step(is_last=micro.is_last)
        micro._ctx.__enter__()

    def _backward(self, micro: MicroStep, loss: torch.Tensor, count: Any) -> None:
        if self._active is not micro:
            raise UsageError("backward() called outside its micro-step; call it inside "
                             "`with micro:` (the engine's sync context must span it)")
        if micro._did_backward:
            raise UsageError(
                f"backward() called twice in micro-step {micro.index} of window "
                f"{micro.window.index}; expected exactly one per micro-step (a second one "
                "would add this micro-batch's gradient twice). Sum the losses and call once")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            seen = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                    else f"a {type(loss).__name__}")
            raise UsageError(
                f"backward() needs a scalar loss tensor, got {seen}; reduce it first, e.g. "
                "loss.sum() (normalization='sum') or loss.mean() ('mean')")
        if not loss.requires_grad:
            raise UsageError(
                "backward() got a loss that does not require grad (seen: requires_grad=False; "
                "it was detached, computed under torch.no_grad()/inference_mode, or from "
                "parameters with requires_grad=False); expected the loss straight from the "
                "model's forward. Do not call .detach()/.item() on it before backward()")
        if count is not None:
            if self.config.normalization == "mean":
                raise UsageError(
                    "a count was passed to backward() but normalization='mean' ignores counts; "
                    "either drop the count, or use normalization='sum' with a summed loss")
            checked = _as_count(count)
            if isinstance(checked, _BadCount):
                raise UsageError(f"backward() got count={checked.seen}; expected the micro-"
                                 "batch's count as a number or a 1-element tensor")
            if isinstance(checked, torch.Tensor):
                # A device tensor: compared at the boundary (reading it here would be a host
                # sync per micro-step).
                micro.window._count_checks.append((micro.index, checked.detach().reshape(())))
            else:
                _check_count(micro.index, float(checked), micro.count)
        w = micro.window
        value = loss.detach().reshape(())
        finite = torch.isfinite(value)
        # Non-finite policy, without a host sync: remember the first bad micro-step on the
        # device, and make a NaN/Inf loss poison *every* gradient it reaches (× NaN instead
        # of × 1). The poison then travels with the gradients through the engine's own
        # reduction (DDP all-reduce, FSDP2 reduce-scatter, DeepSpeed), so the boundary's
        # check on the reduced gradient sees it on every rank with no extra collective.
        idx = torch.full((), micro.index, dtype=torch.int64, device=value.device)
        if w._bad_micro is None:
            w._bad_micro = torch.where(finite, -1, idx)
        else:
            w._bad_micro = torch.where((w._bad_micro < 0) & ~finite, idx, w._bad_micro)
        poison = torch.where(finite, 1.0, math.nan).to(value.dtype)
        # × exactly 1.0 is exact in every dtype: the fast path's numbers are unchanged.
        scaled = (loss.reshape(()) * w._grad_scale) * poison
        share = value * w._loss_share
        self._loss_acc = share if self._loss_acc is None else self._loss_acc + share
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        micro._did_backward = True
        self.engine.backward(scaled)

    def _exit(self, micro: MicroStep, failed: bool) -> None:
        ctx, micro._ctx = micro._ctx, None
        self._active = None
        ctx.__exit__(None, None, None)
        if failed:
            self._abort(micro.window)
            return
        if not micro._did_backward:
            raise UsageError(
                f"micro-step {micro.index} of window {micro.window.index} ended without "
                "backward(); call micro.backward(loss) once inside every micro-step")
        micro.window._entered += 1
        self._boundary.micro_step(window_size=len(micro.window))
        if self._pending_error is not None:  # nonfinite="raise": the window is already closed
            err, self._pending_error = self._pending_error, None
            raise err

    def _abort(self, w: Window) -> None:
        """An exception escaped a micro-step: drop the window's partial gradients (nothing of
        it may reach the next window, F7) and reset the count, so training can go on after
        the caller handled the error (e.g. skipped an out-of-memory batch on every rank)."""
        self.engine.abort_window(self.optimizer)
        self._boundary.count = 0
        self._finish(w, skipped=True, grad_norm=None, lrs=(),
                     reason="an exception in a micro-step aborted the window")
        w.aborted = True
        log.warning("accumguard: window %d aborted by an exception in micro-step; its partial "
                    "gradients were discarded and no optimizer step was taken", w.index)

    def _check_window_finished(self) -> None:
        w = self._window
        if w is None or w.result is not None:
            return
        raise UsageError(
            f"window {w.index} was left after {w._entered} of {len(w)} micro-steps; its "
            "gradients would leak into the next window (failure class F7). Run every "
            "micro-step of a window (do not `break` out of it); a micro-step that raises "
            "aborts its window by itself")

    # -- the boundary --------------------------------------------------------------
    def _step(self) -> None:
        w = self._window
        if w is None or w.result is not None:  # pragma: no cover - the Boundary fires once
            raise UsageError("internal: the boundary fired without an open window")
        opt, scaler = self.optimizer, self.scaler
        if w._count_checks:
            # One host read for the window's tensor counts (see _backward); a mismatch
            # discards the window before any step.
            seen = torch.stack([t.to(torch.float64).cpu() for _, t in w._count_checks]).tolist()
            checks, w._count_checks = w._count_checks, []
            for (index, _), value in zip(checks, seen, strict=True):
                try:
                    _check_count(index, float(value), w.counts[index])
                except UsageError:
                    self._abort(w)
                    raise
        if scaler is not None:
            scaler.unscale_(opt)
        norm = None
        if self.config.max_grad_norm is not None:
            norm = self.engine.clip_grad_norm(self.config.max_grad_norm)
        lrs = tuple(float(g["lr"]) for g in self._param_groups())
        # The non-finite flag, the same on every rank (see Engine.nonfinite_grads): the clip
        # norm when there is one, the replicated gradient otherwise. One host sync per window.
        bad = self.engine.nonfinite_grads(norm)
        reason: str | None = None
        expected_overflow = scaler is not None
        is_bad = False
        if bad is not None:
            is_bad = self._decide_nonfinite(w, bad)
        if is_bad:
            if scaler is not None:
                # GradScaler saw the same inf/NaN in unscale_(): its step() skips and update()
                # lowers the scale, exactly as without accumguard.
                before = scaler.get_scale()
                self.engine.optimizer_step(opt, scaler)
                scaler.update()
                reason = (f"GradScaler found inf/NaN in the gradients and skipped the step "
                          f"(loss scale {before:g} -> {scaler.get_scale():g})")
            else:
                reason = "the reduced gradient holds NaN/Inf"
            self.engine.abort_window(opt)  # discard the window's gradients
            stepped = False
        else:
            self.engine.optimizer_step(opt, scaler)
            stepped = self.engine.step_applied()
            if not stepped:
                reason = self.engine.skip_detail()
                expected_overflow = self.engine.dynamic_loss_scale
            if scaler is not None:
                scale = scaler.get_scale()
                scaler.update()
                # The scaler skips the step (inf/NaN gradient) exactly when it lowers the scale.
                if scaler.get_scale() < scale:
                    stepped = False
                    reason = (f"GradScaler found inf/NaN in the gradients and skipped the step "
                              f"(loss scale {scale:g} -> {scaler.get_scale():g})")
        if self.scheduler is not None and stepped:
            self.scheduler.step()
        self.engine.zero_grad(opt)
        if stepped:
            self.optimizer_steps += 1
        else:
            reason = self._report_nonfinite(w, reason or "the optimizer step was skipped",
                                            expected_overflow)
        self._finish(w, skipped=not stepped, grad_norm=norm, lrs=lrs, reason=reason)

    def _decide_nonfinite(self, w: Window, bad: torch.Tensor) -> bool:
        """Whether to skip the window, from the engine's global gradient flag and this rank's
        loss flag, read in one host sync. A non-finite loss poisons the gradients it reaches,
        so the gradient flag covers it on every rank; only a loss with no gradient path to
        any parameter (e.g. the NaN mean of an empty micro-batch) leaves them finite. On one
        process that window is skipped too; across ranks the flags could differ, so the
        rank only warns (a skip decided alone would desynchronise the ranks)."""
        local = (torch.full((), -1, dtype=torch.int64, device=bad.device)
                 if w._bad_micro is None else w._bad_micro.to(bad.device))
        grad_bad, loss_micro = (int(x) for x in
                                torch.stack([bad.to(torch.int64).reshape(()), local]).tolist())
        if self.engine.world_size == 1:
            return bool(grad_bad) or loss_micro >= 0
        if loss_micro >= 0 and not grad_bad:
            warnings.warn(
                f"{self._prefix()}accumguard: window {w.index}: the loss was NaN/Inf at "
                f"micro-step {loss_micro} on this rank but no gradient was (the loss has no "
                "gradient path to any parameter, e.g. the mean of an empty micro-batch); the "
                "window was stepped on every rank. Use a summed loss (0 for an empty batch)",
                AccumguardWarning, stacklevel=4)
        return bool(grad_bad)

    def _report_nonfinite(self, w: Window, cause: str, expected_overflow: bool) -> str:
        """The slow path (a window was skipped): say which rank's loss went bad at which
        micro-step, warn, and arm NonFiniteError for nonfinite="raise". The extra all-gather
        runs only here, and every rank gets here together (the decision was global)."""
        bad_micro = w._bad_micro
        local = (torch.full((1,), -1, dtype=torch.int64) if bad_micro is None
                 else bad_micro.reshape(1).to(torch.int64))
        if self.engine.world_size > 1:
            import torch.distributed as dist

            local = local.to(self.engine.device)
            gathered = [torch.empty_like(local) for _ in range(self.engine.world_size)]
            dist.all_gather(gathered, local, group=self.engine.process_group)
            per_rank = [int(x) for x in torch.cat(gathered).tolist()]
        else:
            per_rank = [int(local.item())]
        losses = {r: m for r, m in enumerate(per_rank) if m >= 0}
        multi = self.engine.world_size > 1
        if losses:
            where = "; ".join((f"rank {r} " if multi else "") + f"micro-step {m}"
                              for r, m in sorted(losses.items()))
            what = f"non-finite loss (NaN/Inf) at {where}"
        else:
            what = f"{cause} although every loss of the window was finite"
            if expected_overflow:
                what = cause
        text = (f"window {w.index} skipped on every rank (no optimizer step, scheduler held, "
                f"gradients discarded): {what}")
        raising = self.config.nonfinite == "raise" and (bool(losses) or not expected_overflow)
        if raising:
            self._pending_error = NonFiniteError(
                f"{self._prefix()}accumguard: {text}. Find the batch or operation that "
                "produces it (torch.autograd.set_detect_anomaly(True) names the op), or build "
                "the Accumulator with nonfinite='skip' to skip such windows and go on",
                window=w.index, ranks=losses)
        else:
            hint = ("normal while an fp16 loss scale adapts" if expected_overflow and not losses
                    else "nonfinite='raise' stops training instead")
            warnings.warn(f"{self._prefix()}accumguard: {text} ({hint})", AccumguardWarning,
                          stacklevel=2)
            log.warning("accumguard: %s", text)
        return what

    def _param_groups(self) -> list[dict[str, Any]]:
        opt = self.optimizer
        if opt is None:
            opt = getattr(self.model, "optimizer", None)
        return list(getattr(opt, "param_groups", []))

    def _finish(self, w: Window, *, skipped: bool, grad_norm: Any, lrs: tuple,
                reason: str | None = None) -> None:
        if skipped:
            self.skipped_windows += 1
        self.windows_seen += 1
        w.result = StepResult(step=self.optimizer_steps, window=w.index, micro_steps=len(w),
                              count=w.global_count, loss=None if skipped else self._loss_acc,
                              grad_norm=grad_norm, lrs=lrs, skipped=skipped,
                              skip_reason=reason if skipped else None)
        self.history.append(w.result)
        for cb in self.callbacks:
            cb(w.result)

    # -- checkpointing -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The Accumulator's progress; valid only at a boundary (save after a window)."""
        w = self._window
        if self._active is not None or (w is not None and w.result is None):
            done = 0 if w is None else w._entered
            raise UsageError(
                f"state_dict() called in the middle of window {self.windows_seen} ({done} of "
                f"{0 if w is None else len(w)} micro-steps done; its micro-batches are already "
                "taken from the data); expected a boundary. Save after the window's last "
                "micro-step (after window.run(), or after the inner `for micro in window` "
                "loop), or the resumed run would lose that window's data and gradients")
        return {"version": _STATE_VERSION, "accumulation_steps": self.config.accumulation_steps,
                "normalization": self.config.normalization, "windows_seen": self.windows_seen,
                "optimizer_steps": self.optimizer_steps, "skipped_windows": self.skipped_windows,
                "micro_batches_consumed": self.micro_batches_consumed,
                "world_size": self.engine.world_size,
                **({"master_weights": self.masters.state_dict()} if self.masters else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore progress saved by :meth:`state_dict`; K and the normalisation must match."""
        if not isinstance(state, dict):
            raise ConfigError(
                f"load_state_dict() got a {type(state).__name__}; expected the dict returned by "
                "Accumulator.state_dict(). Pass checkpoint['accumulator'] (whatever key you "
                "saved it under), not the whole checkpoint or a list")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ConfigError(
                f"the Accumulator state lacks {missing} (seen keys: {sorted(state)}); expected "
                "the dict returned by Accumulator.state_dict(). Save and load that dict as is")
        bad = [k for k in _STATE_KEYS[3:] if isinstance(state[k], bool)
               or not isinstance(state[k], int) or state[k] < 0]
        if bad:
            raise ConfigError(
                f"the Accumulator state has invalid {bad} ({[state[k] for k in bad]}); expected "
                "non-negative ints as written by Accumulator.state_dict()")
        for key in ("accumulation_steps", "normalization"):
            mine = getattr(self.config, key)
            if state.get(key) != mine:
                raise ConfigError(
                    f"checkpoint has {key}={state.get(key)!r} but this Accumulator has {mine!r}; "
                    "resuming with a different value changes the effective batch mid-run. "
                    "Construct the Accumulator with the checkpoint's value")
        saved_world = state.get("world_size", self.engine.world_size)
        if saved_world != self.engine.world_size:
            raise ConfigError(
                f"checkpoint was written by {saved_world} ranks but this run has "
                f"{self.engine.world_size}; resuming on another world size changes the "
                f"effective batch (K x micro-batch x ranks) mid-run and the data each rank "
                f"reads. Resume on {saved_world} ranks, or start a new run (and scale K so "
                "K x world stays the same) without loading this state")
        if state.get("version") != _STATE_VERSION:
            raise ConfigError(f"unknown Accumulator state version {state.get('version')!r}; "
                              f"this accumguard writes version {_STATE_VERSION}")
        load_master_state(self.masters, state.get("master_weights"))
        self.windows_seen = int(state["windows_seen"])
        self.optimizer_steps = int(state["optimizer_steps"])
        self.skipped_windows = int(state["skipped_windows"])
        self.micro_batches_consumed = int(state["micro_batches_consumed"])

    # -- misc ------------------------------------------------------------------
    @property
    def grad_collectives(self) -> int | None:
        """Gradient collectives the engine issued so far (``None`` if it cannot count)."""
        return self.engine.grad_collectives()

    def close(self) -> None:
        """Restore engine settings the adapter changed."""
        self.engine.close()

    def __enter__(self) -> Accumulator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _prefix(self) -> str:
        return rank_prefix(self.engine.rank if self.engine.world_size > 1 else None)

