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

Beside it: the settings (``_config``), the Window and MicroStep objects (``_window``),
input checks (``_inputs``), the non-finite policy (``_nonfinite``) and the checks of a
saved state (``_state``); their public names are importable from here.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from accumguard.accumulate._config import AccumulationConfig, NonFinitePolicy
from accumguard.accumulate._inputs import (
    BadCount,
    as_count,
    batch_size,
    check_callables,
    check_count,
    check_gathered_counts,
    check_optimizer_params,
)
from accumguard.accumulate._nonfinite import decide_nonfinite, report_nonfinite
from accumguard.accumulate._state import STATE_VERSION, check_state
from accumguard.accumulate._window import MicroStep, StepResult, Window
from accumguard.core.boundary import Boundary
from accumguard.core.errors import (
    AccumguardWarning,
    ConfigError,
    DistributedError,
    UsageError,
    rank_prefix,
)
from accumguard.engines import Engine, resolve_engine
from accumguard.engines.base import Scheduler
from accumguard.engines.precision import (
    AccumulationDtype,
    MasterWeights,
    enable_master_weights,
    load_master_state,
)

__all__ = ["AccumulationConfig", "Accumulator", "MicroStep", "NonFinitePolicy", "StepResult",
           "Window", "batch_size"]

log = logging.getLogger("accumguard")

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
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        accumulation_steps: int,
        engine: str | Engine = "auto",
        scheduler: Scheduler | None = None,
        scaler: torch.amp.GradScaler | None = None,
        max_grad_norm: float | None = None,
        normalization: str = "sum",
        count_fn: Callable[[Any], float | torch.Tensor] | None = None,
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
        check_callables(optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                         count_fn=count_fn)
        self.engine = resolve_engine(model, optimizer, engine)
        if optimizer is None and not self.engine.owns_optimizer:
            raise ConfigError(f"optimizer is None, but the {self.engine.name} engine needs the "
                              "optimizer to step; pass it as the second argument")
        if optimizer is not None and not self.engine.owns_optimizer:
            check_optimizer_params(model, optimizer)
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
            counts = [as_count(self.count_fn(b)) for b in batches]
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
        bad = next((x for x in counts if isinstance(x, BadCount)), None)
        if counts:
            c = torch.stack([torch.as_tensor(0.0 if isinstance(x, BadCount) else x,
                                             dtype=torch.float64, device=dev).reshape(())
                             for x in counts])
            stats = torch.stack([
                torch.tensor(float(len(batches)), dtype=torch.float64, device=dev), c.sum(),
                c.min(), c.max(),
                torch.tensor(float(bad is not None), dtype=torch.float64, device=dev)])
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
        check_gathered_counts(rows, bad, counts, prefix=self._prefix(), rank=self.engine.rank,
                              window=self.windows_seen)
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

    def _backward(self, micro: MicroStep, loss: torch.Tensor,
                  count: float | torch.Tensor | None) -> None:
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
            checked = as_count(count)
            if isinstance(checked, BadCount):
                raise UsageError(f"backward() got count={checked.seen}; expected the micro-"
                                 "batch's count as a number or a 1-element tensor")
            if isinstance(checked, torch.Tensor):
                # A device tensor: compared at the boundary (reading it here would be a host
                # sync per micro-step).
                micro.window._count_checks.append((micro.index, checked.detach().reshape(())))
            else:
                check_count(micro.index, float(checked), micro.count)
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
        assert ctx is not None  # (set by _enter)
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
                    check_count(index, float(value), w.counts[index])
                except UsageError:
                    self._abort(w)
                    raise
        if scaler is not None:
            assert opt is not None  # (a scaler is refused with DeepSpeed, the one without)
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
            is_bad = decide_nonfinite(self.engine, w, bad, prefix=self._prefix())
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
            reason, self._pending_error = report_nonfinite(
                self.engine, w, reason or "the optimizer step was skipped", expected_overflow,
                policy=self.config.nonfinite, prefix=self._prefix())
        self._finish(w, skipped=not stepped, grad_norm=norm, lrs=lrs, reason=reason)


    def _param_groups(self) -> list[dict[str, Any]]:
        opt = self.optimizer
        if opt is None:
            opt = getattr(self.model, "optimizer", None)
        return list(getattr(opt, "param_groups", []))

    def _finish(self, w: Window, *, skipped: bool, grad_norm: torch.Tensor | None,
                lrs: tuple[float, ...],
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
        return {"version": STATE_VERSION, "accumulation_steps": self.config.accumulation_steps,
                "normalization": self.config.normalization, "windows_seen": self.windows_seen,
                "optimizer_steps": self.optimizer_steps, "skipped_windows": self.skipped_windows,
                "micro_batches_consumed": self.micro_batches_consumed,
                "world_size": self.engine.world_size,
                **({"master_weights": self.masters.state_dict()} if self.masters else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore progress saved by :meth:`state_dict`; K and the normalisation must match."""
        check_state(state, accumulation_steps=self.config.accumulation_steps,
                    normalization=self.config.normalization, world_size=self.engine.world_size)
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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prefix(self) -> str:
        return rank_prefix(self.engine.rank if self.engine.world_size > 1 else None)

