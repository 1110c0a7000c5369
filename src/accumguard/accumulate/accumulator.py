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
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from accumguard.core.boundary import Boundary, check_accumulation_steps
from accumguard.core.errors import (
    AccumguardWarning,
    ConfigError,
    DistributedError,
    UsageError,
    rank_prefix,
)
from accumguard.core.scaling import GradReduction, loss_scale
from accumguard.engines import Engine, resolve_engine

__all__ = ["AccumulationConfig", "Accumulator", "MicroStep", "StepResult", "Window", "batch_size"]

log = logging.getLogger("accumguard")

_STATE_VERSION = 1


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

    def __post_init__(self) -> None:
        check_accumulation_steps(self.accumulation_steps)
        if self.normalization not in ("sum", "mean"):
            raise ConfigError(
                f"`normalization` ({self.normalization!r}) must be 'sum' (loss_fn returns the "
                "sum over samples/tokens; exact for uneven sizes) or 'mean' (equal-size "
                "micro-batches, loss already averaged)"
            )
        if self.max_grad_norm is not None and not (
            isinstance(self.max_grad_norm, (int, float)) and self.max_grad_norm > 0
            and math.isfinite(self.max_grad_norm)
        ):
            raise ConfigError(
                f"`max_grad_norm` ({self.max_grad_norm!r}) must be a positive finite number, "
                "or None to disable clipping"
            )


@dataclass(frozen=True)
class StepResult:
    """What happened at one boundary; passed to ``on_boundary`` callbacks.

    ``loss`` is this rank's share of the window's normalised loss (the sum over
    ranks is the loss of the full effective batch). ``count`` is N, over all
    micro-steps and ranks. ``lrs`` are the learning rates the step used.
    """

    step: int
    window: int
    micro_steps: int
    count: float
    loss: torch.Tensor | None
    grad_norm: torch.Tensor | None
    lrs: tuple[float, ...]
    skipped: bool = False


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
        assert self.result is not None
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
    ) -> None:
        self.config = AccumulationConfig(
            accumulation_steps=accumulation_steps, normalization=normalization,
            max_grad_norm=max_grad_norm, drop_last_window=drop_last_window)
        self.engine = resolve_engine(model, optimizer, engine)
        if optimizer is None and not self.engine.owns_optimizer:
            raise ConfigError(f"optimizer is None, but the {self.engine.name} engine needs the "
                              "optimizer to step; pass it as the second argument")
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.count_fn = count_fn or batch_size
        self.callbacks = list(on_boundary)
        self.engine.bind(optimizer, accumulation_steps)
        self.engine.check_options(max_grad_norm=max_grad_norm, scaler=scaler, scheduler=scheduler)
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

    # -- data --------------------------------------------------------------
    def windows(self, data: Iterable[Any]) -> Iterator[Window]:
        """Group ``data`` into windows of K micro-batches, prefetched so that the window's
        size and sample count (over all ranks) are known before its first backward."""
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
            counts = [self.count_fn(b) for b in batches]
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
            assert window is not None
            if window.skipped:
                self._finish(window, skipped=True, grad_norm=None, lrs=())
            yield window
            if len(batches) < k:
                return

    def _window_stats(self, batches: list[Any], counts: list[Any]) -> tuple[int, int, list[int]]:
        """One all-gather per window: micro-steps, count, min/max size of every rank.

        Also stores the :class:`Window` being built in ``self._window``.
        """
        dev = self.engine.device
        if counts:
            c = torch.stack([torch.as_tensor(x, dtype=torch.float64, device=dev).reshape(())
                             for x in counts])
            stats = torch.stack([torch.tensor(float(len(batches)), dtype=torch.float64,
                                              device=dev), c.sum(), c.min(), c.max()])
        else:
            stats = torch.tensor([0.0, 0.0, math.inf, -math.inf], dtype=torch.float64, device=dev)
        if self.engine.world_size > 1:
            import torch.distributed as dist

            gathered = [torch.empty_like(stats) for _ in range(self.engine.world_size)]
            dist.all_gather(gathered, stats, group=self.engine.process_group)
            rows = torch.stack(gathered).tolist()
        else:
            rows = [stats.tolist()]
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
        if count is not None:
            if self.config.normalization == "mean":
                raise UsageError(
                    "a count was passed to backward() but normalization='mean' ignores counts; "
                    "either drop the count, or use normalization='sum' with a summed loss")
            seen = float(torch.as_tensor(count).item())
            if seen != micro.count:
                raise UsageError(
                    f"backward() got count={seen:g} but count_fn reported {micro.count:g} for "
                    "this micro-batch. The window's N is fixed before the first backward, so "
                    "pass a count_fn that returns the same count (e.g. valid tokens) to the "
                    "Accumulator")
        w = micro.window
        scaled = loss.reshape(()) * w._grad_scale
        share = loss.detach().reshape(()) * w._loss_share
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

    def _abort(self, w: Window) -> None:
        """An exception escaped a micro-step: drop the window's partial gradients (nothing of
        it may reach the next window, F7) and reset the count, so training can go on after
        the caller handled the error (e.g. skipped an out-of-memory batch on every rank)."""
        self.engine.abort_window(self.optimizer)
        self._boundary.count = 0
        self._finish(w, skipped=True, grad_norm=None, lrs=())
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
        assert w is not None and w.result is None
        opt = self.optimizer
        if self.scaler is not None:
            self.scaler.unscale_(opt)
        norm = None
        if self.config.max_grad_norm is not None:
            norm = self.engine.clip_grad_norm(self.config.max_grad_norm)
        lrs = tuple(float(g["lr"]) for g in self._param_groups())
        self.engine.optimizer_step(opt, self.scaler)
        stepped = True
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.update()
            # The scaler skips the step (inf/NaN gradient) exactly when it lowers the scale.
            stepped = self.scaler.get_scale() >= scale
        if self.scheduler is not None and stepped:
            self.scheduler.step()
        self.engine.zero_grad(opt)
        if stepped:
            self.optimizer_steps += 1
        self._finish(w, skipped=not stepped, grad_norm=norm, lrs=lrs)

    def _param_groups(self) -> list[dict[str, Any]]:
        opt = self.optimizer
        if opt is None:
            opt = getattr(self.model, "optimizer", None)
        return list(getattr(opt, "param_groups", []))

    def _finish(self, w: Window, *, skipped: bool, grad_norm: Any, lrs: tuple) -> None:
        if skipped:
            self.skipped_windows += 1
        self.windows_seen += 1
        w.result = StepResult(step=self.optimizer_steps, window=w.index, micro_steps=len(w),
                              count=w.global_count, loss=None if skipped else self._loss_acc,
                              grad_norm=grad_norm, lrs=lrs, skipped=skipped)
        self.history.append(w.result)
        for cb in self.callbacks:
            cb(w.result)

    # -- checkpointing -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The Accumulator's progress; valid only at a boundary (save after a window)."""
        w = self._window
        if self._active is not None or (w is not None and not w.skipped and w.result is None
                                        and w._entered > 0):
            raise UsageError(
                "state_dict() called in the middle of a window; a checkpoint must be taken at "
                "a boundary (after the window's last micro-step), or the resumed run would "
                "lose the gradients accumulated so far")
        return {"version": _STATE_VERSION, "accumulation_steps": self.config.accumulation_steps,
                "normalization": self.config.normalization, "windows_seen": self.windows_seen,
                "optimizer_steps": self.optimizer_steps, "skipped_windows": self.skipped_windows,
                "micro_batches_consumed": self.micro_batches_consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore progress saved by :meth:`state_dict`; K and the normalisation must match."""
        for key in ("accumulation_steps", "normalization"):
            mine = getattr(self.config, key)
            if state.get(key) != mine:
                raise ConfigError(
                    f"checkpoint has {key}={state.get(key)!r} but this Accumulator has {mine!r}; "
                    "resuming with a different value changes the effective batch mid-run. "
                    "Construct the Accumulator with the checkpoint's value")
        if state.get("version") != _STATE_VERSION:
            raise ConfigError(f"unknown Accumulator state version {state.get('version')!r}; "
                              f"this accumguard writes version {_STATE_VERSION}")
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

