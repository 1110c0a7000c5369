"""DeepSpeed (``deepspeed.initialize``), ZeRO stages 0-3: the adapter owns the boundary.

How the engine is driven, and why (checked against DeepSpeed 0.19.8):

* **The boundary is set explicitly**, ``engine.set_gradient_accumulation_boundary(is_last)``
  before every micro-step's backward, instead of relying on the engine's own
  micro-step counter (``(micro_steps + 1) % gradient_accumulation_steps``).
  The counter is only right when every window has exactly the config's GA
  micro-steps and ``step()`` is called after every backward; a short final
  window would leave it out of phase for the rest of the run (F13), and a
  config GA of 1 makes *every* backward a boundary, which on ZeRO-1/2 resets
  the accumulated partition so only the last micro-batch survives (F2). With
  the flag set by the adapter the engine reduces and steps exactly where the
  Accumulator's window ends, whatever its length.
* ``engine.backward(loss, scale_wrt_gas=False)``: the engine applies no ÷GA of
  its own; its only operation on gradients is the average over the W
  data-parallel ranks, declared in :meth:`reduction`, and
  :func:`accumguard.core.scaling.loss_scale` composes it with N. No K anywhere else.
* ``engine.step()`` once per window, at the boundary (the flag is True then),
  so the optimizer steps exactly once per window; DeepSpeed zeroes the
  gradients inside ``step()``.

Two modes:

* ``sync="eager"``: the engine's normal reduction. ZeRO-2/3 reduce (and
  partition) gradients in every micro-step's backward (K reductions per step);
  ZeRO-0/1 reduce only at the boundary. Needs config
  ``gradient_accumulation_steps == K`` (the engine's config then describes the
  real batch).
* ``sync="deferred"`` (ZeRO 1/2/3): the window's backwards run inside
  ``engine.coalesce_grad_reduction()``; leaving the block (in :meth:`sync`)
  issues one reduction pass, so one gradient reduction per optimizer step.
  DeepSpeed defines one such block as one optimizer step, so the config must
  say ``gradient_accumulation_steps: 1``; with GA = K the engine would wait for
  K ``step()`` calls and (with its own counter) never step.
  The block is closed *lean* (``lean_flush=True``, default): without DeepSpeed's
  redundant copies of the gradients (a flattened copy of the contiguous bucket on
  ZeRO-1/2, the bucket copy that ZeRO-3's reduce-scatter copies again; on CPU the ZeRO-1/2
  reduce bucket kept from one flush to the next, ``keep_reduce_bucket``), bit-identical
  to DeepSpeed's own flush (:mod:`accumguard.engines._deepspeed_flush`).
* ``sync="auto"`` (default): deferred on ZeRO 1-3 when the config's GA is 1,
  eager when it equals K (or on ZeRO-0, which has no coalescing and already
  reduces only at the boundary).

Memory for communication on ZeRO-3 (``window_memory``):

* ``"sharded"`` (default): the engine as configured. ZeRO-3 all-gathers the parameters
  in every micro-step's forward and releases them at the end of its backward: K full
  gathers per optimizer step, whatever ``stage3_max_live_parameters``,
  ``stage3_max_reuse_distance`` or prefetch say (they act within one forward/backward).
* ``"unsharded"``: the parameters stay gathered from the window's first forward to the
  last micro-step's backward, which releases them as usual: one gather per window, at
  the cost of one unsharded copy of the parameters for the window. DeepSpeed has no
  setting for this; the adapter marks the partitioned parameters persistent
  (``ds_persist``, the flag behind ``stage3_param_persistence_threshold``) for micro-steps
  1..K-1 and unmarks them before the last backward, so the engine's own release hooks do
  the rest; the parameter coordinator's cached release sets are cleared at each switch.
  With ``skip_idle_hooks`` the whole window runs without DeepSpeed's module hooks: its
  parameters gathered in one call at its first micro-step and released after its last
  backward (:mod:`accumguard.engines._deepspeed_window`). ZeRO-3 only (ZeRO 0-2 never shard
  parameters). Tested with DeepSpeed 0.19.8.

Clipping: DeepSpeed clips inside ``step()`` with config ``gradient_clipping``
(default 1.0 when the key is absent: F9), on the reduced, possibly partitioned
gradient. Clipping it again here would clip twice, and clipping ZeRO
partitions by hand would duplicate its internals, so **the engine clips and
the adapter never does**: an Accumulator ``max_grad_norm`` must equal the
config's value (else ConfigError), and the adapter only reports the norm.

A ``torch.amp.GradScaler`` is refused (DeepSpeed has its own loss scaling for
fp16), and so is an Accumulator scheduler when the engine already owns one
(it would step twice).

Size (~600 lines): mostly the config checks and error messages that make it safe to drive.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from accumguard.core.errors import AccumguardWarning, ConfigError, UsageError
from accumguard.core.scaling import GradReduction
from accumguard.engines._deepspeed_flush import LeanFlush
from accumguard.engines._deepspeed_window import HeldParameters
from accumguard.engines.base import Engine, Scheduler
from accumguard.engines.collectives import (
    DS_COMM_MODULES,
    DS_REDUCE_OPS,
    OWN_COMM_MODULE,
    OWN_REDUCE_OPS,
)
from accumguard.engines.registry import is_deepspeed_engine

if TYPE_CHECKING:  # (DeepSpeed ships no type information: the name documents the type)
    from deepspeed import DeepSpeedEngine

__all__ = ["DeepSpeedEngineAdapter"]

log = logging.getLogger("accumguard")

_MODES = ("auto", "eager", "deferred")
_WINDOW_MEMORY = ("sharded", "unsharded")
_DS_REDUCTIONS = DS_REDUCE_OPS
_DS_COMM_MODULES = DS_COMM_MODULES


def _raw_config(engine: object) -> dict[str, Any]:
    """The config dict DeepSpeed parsed (keys the user set, defaults absent)."""
    cfg = getattr(getattr(engine, "_config", None), "_param_dict", None)
    if isinstance(cfg, dict):
        return cfg
    raw = getattr(engine, "config", None)
    if isinstance(raw, dict):
        return raw
    if raw is not None:  # a path
        from accumguard.static.dsconfig import load_config

        return dict(load_config(raw))
    return {}


class DeepSpeedEngineAdapter(Engine):
    """Adapter for a ``deepspeed.DeepSpeedEngine`` (the first value ``deepspeed.initialize``
    returns). Pass ``optimizer=None`` to the Accumulator: the engine owns its optimizer.

    Args:
        model: the DeepSpeed engine.
        sync: ``"auto"``, ``"eager"`` or ``"deferred"`` (see the module docstring).
        window_memory: ``"sharded"`` (default) or ``"unsharded"``: on ZeRO-3, keep the
            parameters gathered for the whole window (one all-gather per window instead of
            one per micro-step; one unsharded copy of the parameters in memory meanwhile).
        lean_flush: with ``sync="deferred"``, close the coalesced block without DeepSpeed's
            redundant gradient copies: ZeRO-1/2 all-reduce the contiguous reduce bucket in
            place instead of a flattened copy of it, ZeRO-3 skips the copy into the bucket
            that its reduce-scatter copies again (same numbers, bit for bit; see
            :mod:`accumguard.engines._deepspeed_flush`). Default True; False leaves
            DeepSpeed's flush untouched.
        keep_reduce_bucket: with the lean flush on ZeRO-1/2 and the bucket on the CPU, keep
            DeepSpeed's contiguous reduce bucket from one flush to the next instead of
            allocating (and page-faulting) a new one every flush; the pages the flush wrote
            (the window's gradients in the bucket's dtype) then stay resident between flushes
            (see :mod:`accumguard.engines._deepspeed_flush`). Default True; no effect on GPUs.
        skip_idle_hooks: with ``window_memory="unsharded"``, run the window without DeepSpeed's
            ZeRO-3 module hooks (the parameters gathered in one call, then released after the
            last backward; bit-identical, :mod:`accumguard.engines._deepspeed_window`). Default
            True.
    """

    name = "deepspeed"
    owns_optimizer = True

    def __init__(self, model: DeepSpeedEngine, *, sync: str = "auto",
                 window_memory: str = "sharded", lean_flush: bool = True,
                 skip_idle_hooks: bool = True, keep_reduce_bucket: bool = True) -> None:
        if not is_deepspeed_engine(model):
            raise ConfigError(
                f"DeepSpeedEngineAdapter needs the engine returned by deepspeed.initialize, got "
                f"{type(model).__name__}; pass `engine, optimizer, _, _ = "
                "deepspeed.initialize(model=..., config=...)` and give the Accumulator `engine`")
        if sync not in _MODES:
            raise ConfigError(f"sync ({sync!r}) must be one of {_MODES}")
        if window_memory not in _WINDOW_MEMORY:
            raise ConfigError(f"window_memory ({window_memory!r}) must be one of "
                              f"{_WINDOW_MEMORY}")
        if getattr(model, "optimizer", None) is None:
            raise ConfigError(
                "the DeepSpeed engine has no optimizer; pass optimizer=... to "
                "deepspeed.initialize or an \"optimizer\" section in its config")
        for needed in ("set_gradient_accumulation_boundary", "coalesce_grad_reduction"):
            if not hasattr(model, needed):
                raise ConfigError(
                    f"this DeepSpeed engine has no `{needed}`; accumguard drives DeepSpeed "
                    "through it and was tested with DeepSpeed 0.19.8: upgrade deepspeed")
        super().__init__(model, process_group=None)
        self.engine = model
        self.stage = int(model.zero_optimization_stage())
        self.rank, self.world_size = int(model.global_rank), int(model.dp_world_size)
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() != self.world_size:
            raise ConfigError(
                f"DeepSpeed's data-parallel size ({self.world_size}) differs from the world "
                f"size ({dist.get_world_size()}): tensor/pipeline/sequence parallelism is not "
                "supported yet (the window's sample count would be gathered over the wrong "
                "ranks). Use the adapter with pure data parallelism")
        self.config = _raw_config(model)
        self.requested_sync = sync
        self.sync_mode = sync  # resolved in bind(), when K is known
        self.accumulation_steps: int | None = None
        self._coalesce: AbstractContextManager[None] | None = None  # the open coalesce_grad_reduction() context, if any
        self._aborted = False  # an exception interrupted a coalesced window (see abort_window)
        self._saved_flag: bool | None = None
        self._norm: torch.Tensor | None = None
        self._rounds = 0
        self.window_memory = window_memory
        # ZeRO-3 parameters kept gathered over the window ("unsharded")
        self.held: HeldParameters | None = None
        self._is_last = False
        self._position = 0  # micro-steps of the current window entered so far
        self.lean_flush = lean_flush
        self.keep_reduce_bucket = keep_reduce_bucket
        self.flush: LeanFlush | None = None  # set in bind() when it applies
        if window_memory == "unsharded":
            self._prepare_unsharded(skip_idle_hooks)

    # -- lifecycle -------------------------------------------------------------------
    def bind(self, optimizer: torch.optim.Optimizer | None, accumulation_steps: int) -> None:
        if optimizer is not None and optimizer is not self.engine.optimizer and \
                optimizer is not getattr(self.engine, "basic_optimizer", None):
            raise ConfigError(
                f"the Accumulator got optimizer {type(optimizer).__name__}, which is not the "
                "DeepSpeed engine's optimizer; pass optimizer=None (the engine steps its own)")
        k = accumulation_steps
        self.accumulation_steps = k
        ga = int(self.engine.gradient_accumulation_steps())
        self.sync_mode = self._resolve_mode(ga, k)
        self._check_config(k)
        self._saved_flag = self.engine._is_gradient_accumulation_boundary
        why = self._coalescing_unsupported() if self.sync_mode == "eager" else ""
        if self.lean_flush and self.sync_mode == "deferred":
            not_here = LeanFlush.unsupported(self.engine.optimizer, self.stage)
            if not_here:
                log.info("accumguard: DeepSpeed's flush left as is (lean_flush): %s", not_here)
            else:
                self.flush = LeanFlush(self.engine.optimizer, self.stage,
                                       keep_bucket=self.keep_reduce_bucket)
        log.info("accumguard: DeepSpeed ZeRO-%d, sync=%s, config GA=%d, K=%d, clipping=%g%s",
                 self.stage, self.sync_mode, ga, k, self.clip_value,
                 f" (eager: {why})" if why else "")

    def set_accumulation_dtype(self, mode: str) -> str:
        """DeepSpeed sums micro-gradients itself, in ``data_types.grad_accum_dtype`` (default:
        the training precision). Checked, not changed: with bf16/fp16 and K > 1 a missing or
        low-precision ``grad_accum_dtype`` is warned about by the config check (AG204) under
        ``"auto"`` and refused under ``"float32"``."""
        cfg = self.config
        prec = ("bf16" if any(isinstance(cfg.get(key), dict) and cfg[key].get("enabled")
                              for key in ("bf16", "bfloat16"))
                else "fp16" if isinstance(cfg.get("fp16"), dict) and cfg["fp16"].get("enabled")
                else None)
        dtype = (cfg.get("data_types") or {}).get("grad_accum_dtype")
        fp32 = isinstance(dtype, str) and dtype.lower() in ("fp32", "float32")
        if prec is None or fp32 or (self.accumulation_steps or 1) <= 1:
            return "float32"
        if mode == "float32":
            raise ConfigError(
                f"accumulation_dtype='float32' was asked for, but the DeepSpeed config enables "
                f"{prec} with `data_types.grad_accum_dtype` "
                f"{'unset' if dtype is None else repr(dtype)}: the {self.accumulation_steps} "
                f"micro-gradients of a window would be summed in {prec}. Add "
                '"data_types": {"grad_accum_dtype": "fp32"} to the DeepSpeed config, or pass '
                "accumulation_dtype='native' to accept it")
        return {"bf16": "bfloat16", "fp16": "float16"}[prec]

    def _resolve_mode(self, ga: int, k: int) -> str:
        mode = self.requested_sync
        unsupported = self._coalescing_unsupported()
        if mode == "auto":
            if self.stage == 0:
                mode = "eager"
            elif ga == 1 and unsupported:
                raise ConfigError(
                    f"DeepSpeed gradient_accumulation_steps is 1, which needs the coalesced "
                    f"reduction (sync='deferred'), but {unsupported}. Set "
                    f"\"gradient_accumulation_steps\": {k} in the DeepSpeed config: the adapter "
                    "then drives the engine's native accumulation (sync='eager'; K gradient "
                    "reductions per step on ZeRO-2/3)")
            elif ga == 1:
                mode = "deferred"
            elif ga == k:
                mode = "eager"
            else:
                raise ConfigError(
                    f"DeepSpeed gradient_accumulation_steps is {ga} but the Accumulator runs "
                    f"K={k} micro-steps per optimizer step; the engine would step every {ga} "
                    "backwards instead of every window. Set gradient_accumulation_steps to 1 "
                    f"(coalesced reduction, cheapest) or to {k} (the engine's native GA)")
        if mode == "deferred":
            if self.stage == 0:
                raise ConfigError(
                    "sync='deferred' needs ZeRO stage 1, 2 or 3 (engine.coalesce_grad_reduction "
                    "does not support stage 0); use sync='eager': on stage 0 the engine already "
                    "all-reduces once per optimizer step, at the boundary")
            if unsupported:
                raise ConfigError(
                    f"sync='deferred' needs engine.coalesce_grad_reduction(), but {unsupported}. "
                    f"Use sync='eager' with \"gradient_accumulation_steps\": {k} in the config")
            if ga != 1:
                raise ConfigError(
                    f"sync='deferred' needs DeepSpeed gradient_accumulation_steps 1, got {ga}: "
                    "one coalesce_grad_reduction() block is one optimizer step for DeepSpeed, "
                    f"and with GA {ga} it waits for {ga} step() calls (the optimizer stalls). "
                    "Set \"gradient_accumulation_steps\": 1 (keep K in the Accumulator), or use "
                    f"sync='eager' with gradient_accumulation_steps {k}")
        elif ga != k:
            why = ("every backward is a boundary, so ZeRO-1/2 keep only the last micro-batch "
                   "(F2)" if ga == 1 else f"the engine's batch is {ga} micro-steps, not {k}")
            raise ConfigError(
                f"sync='eager' needs DeepSpeed gradient_accumulation_steps == K ({k}), got "
                f"{ga}: {why}. Set \"gradient_accumulation_steps\": {k}, or use "
                "sync='deferred' with gradient_accumulation_steps 1")
        return mode

    def _coalescing_unsupported(self) -> str:
        """Why ``coalesce_grad_reduction()`` would fail on this engine ("" if it works).

        DeepSpeed 0.19.8 raises NotImplementedError at the *first micro-step* for stage 0,
        pipeline parallelism, and optimizer wrappers without the per-parameter reduction
        hooks the block relies on (BF16_Optimizer for bf16 + fp32 gradient accumulation,
        FP16_Optimizer); the adapter asks the same questions up front instead."""
        eng = self.engine
        if self.stage == 0:
            return "ZeRO stage 0 has no coalesced reduction"
        if getattr(eng, "pipeline_parallelism", False):
            return "pipeline parallelism does not support it"
        managed = getattr(eng, "managed_gradient_accumulation", None)
        if callable(managed) and not managed():
            return "the config sets managed_gradient_accumulation false"
        if not hasattr(eng.optimizer, "_coalesce_grad_reduction"):
            return (f"the engine's optimizer wrapper {type(eng.optimizer).__name__} does not "
                    "support it (DeepSpeed routes its gradients around the coalescing hooks)")
        return ""

    def _prepare_unsharded(self, skip_idle_hooks: bool) -> None:
        if self.stage != 3:
            raise ConfigError(
                f"window_memory='unsharded' applies to ZeRO stage 3 only (this engine runs "
                f"stage {self.stage}, whose parameters are never sharded); drop the option")
        held = HeldParameters(self.engine, skip_idle_hooks=skip_idle_hooks)
        if held.clear_release_cache is None:
            raise ConfigError(
                "window_memory='unsharded' relies on the ZeRO-3 parameter coordinator of "
                "DeepSpeed 0.19.8 (its cached release sets), which this DeepSpeed does not "
                "have; use window_memory='sharded' or raise stage3_param_persistence_threshold "
                "(parameters up to it are never partitioned, for the whole run)")
        self.held = held

    def _hold(self, hold: bool) -> None:  # held gathered (persistent) or not
        if self.held is not None:
            self.held.hold(hold)

    def _check_config(self, k: int) -> None:
        """Static checks of the config (accumguard.static.dsconfig): errors raise, warnings warn."""
        from accumguard.static.dsconfig import check_config

        deferred = self.sync_mode == "deferred"
        findings = check_config(self.config, world_size=self.world_size, accumulation_steps=k,
                                coalesced=deferred)
        if deferred and k > 1:
            # The K backwards of a coalesced window accumulate like GA = K: check precision too.
            as_ga = {**self.config, "gradient_accumulation_steps": k}
            findings += [f for f in check_config(as_ga, world_size=self.world_size)
                         if f.code == "AG204"]
        errors = []
        for f in findings:
            severity = getattr(f.severity, "value", f.severity)
            text = f"{f.code} {f.message}; fix: {f.fix}"
            if severity == "error":
                errors.append(text)
            elif severity == "warning":
                warnings.warn(f"accumguard: DeepSpeed config: {text}", AccumguardWarning,
                              stacklevel=4)
            else:
                log.info("accumguard: DeepSpeed config: %s", text)
        if errors:
            raise ConfigError("DeepSpeed config problems:\n  " + "\n  ".join(errors))

    def check_options(self, *, max_grad_norm: float | None,
                      scaler: torch.amp.GradScaler | None = None,
                      scheduler: Scheduler | None = None) -> None:
        if scaler is not None:
            raise ConfigError(
                "a torch GradScaler cannot be used with DeepSpeed: the engine scales fp16 losses "
                "itself (config \"fp16\": {\"enabled\": true} uses dynamic loss scaling). Pass "
                "scaler=None")
        if scheduler is not None and getattr(self.engine, "lr_scheduler", None) is not None:
            raise ConfigError(
                "the DeepSpeed engine already has an LR scheduler (stepped inside engine.step()) "
                "and the Accumulator was given one too: it would step twice per optimizer step. "
                "Give the scheduler to only one of them")
        clip = self.clip_value
        if max_grad_norm is not None and not math.isclose(max_grad_norm, clip, rel_tol=1e-12):
            seen = ("absent (DeepSpeed then clips at 1.0)" if "gradient_clipping" not in
                    self.config else f"{clip:g}")
            raise ConfigError(
                f"the Accumulator's max_grad_norm is {max_grad_norm:g} but the DeepSpeed config's "
                f"gradient_clipping is {seen}. DeepSpeed clips inside engine.step(), so accumguard "
                "leaves clipping to it and never clips a second time. Set "
                f"\"gradient_clipping\": {max_grad_norm:g} in the config (or max_grad_norm=None)")
        if max_grad_norm is None and clip > 0 and "gradient_clipping" in self.config:
            log.info("accumguard: DeepSpeed clips at gradient_clipping=%g inside engine.step() "
                     "(from its config; the Accumulator's max_grad_norm is None)", clip)

    @property
    def clip_value(self) -> float:
        """The max norm DeepSpeed clips at inside ``step()`` (0 = no clipping)."""
        return float(self.engine.gradient_clipping())

    def abort_window(self, optimizer: torch.optim.Optimizer | None) -> None:
        """PARTIAL: DeepSpeed has no API to discard a half-accumulated window. In eager mode
        the engine's gradients are zeroed; in deferred mode the open coalesced block cannot be
        left without its flush (a collective only this rank would enter), so the adapter is
        marked unusable and every later micro-step says so."""
        self._hold(False)
        if self.held is not None:
            self.held.release_window()  # an aborted last micro-step run without the hooks
        self._position = 0
        if self._coalesce is not None:
            self._coalesce = None
            self._aborted = True
        else:
            self.engine.zero_grad()

    def close(self) -> None:
        self._hold(False)
        if self.flush is not None:
            self.flush.release()
        if self._coalesce is not None:
            ctx, self._coalesce = self._coalesce, None
            ctx.__exit__(None, None, None)
        if self.accumulation_steps is not None:
            # No public API sets the flag back to "unset" (None: the engine's own counter
            # decides again), so the attribute is restored directly.
            self.engine._is_gradient_accumulation_boundary = self._saved_flag

    @property
    def device(self) -> torch.device:
        return torch.device(self.engine.device)

    # -- the four questions -----------------------------------------------------------
    def reduction(self) -> GradReduction:
        # backward(scale_wrt_gas=False): no ÷GA. ZeRO 0-3 average over the data-parallel ranks.
        return GradReduction(world_size=self.world_size, averages_over_ranks=True, divides_by=1.0)

    @contextlib.contextmanager
    def micro_step(self, *, is_last: bool) -> Iterator[None]:
        if self.accumulation_steps is None:
            raise UsageError("micro_step() before bind(); construct an Accumulator with this "
                             "engine, it binds the adapter")
        if self._aborted:
            raise UsageError(
                "an exception interrupted a coalesced (sync='deferred') DeepSpeed window, and "
                "DeepSpeed cannot discard half-reduced gradients; rebuild the engine (or "
                "restore the last checkpoint) before training on")
        if self.sync_mode == "deferred" and self._coalesce is None:
            # The block opens at the window's first micro-step and closes in sync().
            self._coalesce = self.engine.coalesce_grad_reduction()
            self._coalesce.__enter__()
        self._is_last = is_last = bool(is_last)
        self.engine.set_gradient_accumulation_boundary(is_last)
        position, self._position = self._position, 0 if is_last else self._position + 1
        if not is_last:
            self._hold(True)  # no-op unless window_memory="unsharded"
        if self.held is None:
            yield
            return
        with self.held.around_micro_step(position, last=is_last):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        if self._is_last:
            self._hold(False)  # the last backward releases (re-shards) them
        try:
            with self._counting_round():
                self.engine.backward(loss, scale_wrt_gas=False)
        finally:
            if self._is_last and self.held is not None:
                self.held.release_window()  # when that backward ran without the hooks

    def sync(self) -> None:
        if self._coalesce is not None:
            ctx, self._coalesce = self._coalesce, None
            flush = self.flush
            with self._counting_round(), \
                    (flush.active() if flush is not None else contextlib.nullcontext()):
                ctx.__exit__(None, None, None)  # one reduction pass over the window's gradients

    @contextlib.contextmanager
    def _counting_round(self) -> Iterator[None]:
        """Gradient reductions happen in backward (eager ZeRO-2/3; ZeRO-0/1 at the boundary)
        or when the coalesced block closes, never in step() (whose norm/overflow all-reduces
        are not gradient reductions). Wrap deepspeed.comm's reduce functions for this call
        only; a call that issued at least one is one round."""
        seen = [0]
        patched: list[tuple[object, str, object]] = []

        def counted(real: Callable[..., object]) -> Callable[..., object]:
            def call(*args: object, **kwargs: object) -> object:
                seen[0] += 1
                return real(*args, **kwargs)

            return call

        for name in (*_DS_COMM_MODULES, OWN_COMM_MODULE):  # the latter: the 2-rank exchange
            module = sys.modules.get(name)
            for op in (*_DS_REDUCTIONS, *OWN_REDUCE_OPS):
                real = getattr(module, op, None) if module is not None else None
                if callable(real):
                    patched.append((module, op, real))
                    setattr(module, op, counted(real))
        try:
            yield
        finally:
            for owner, attr, original in reversed(patched):
                setattr(owner, attr, original)
            if seen[0]:
                self._rounds += 1

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clipping happens inside ``engine.step()``; return the pre-clip global norm.

        On ZeRO 1-3 DeepSpeed computes the norm during ``step()``: the tensor
        returned here is filled in place right after it (NaN until then). On
        stage 0 the reduced gradient sits in ``param.grad``, so it is measured now.
        """
        if not math.isclose(max_norm, self.clip_value, rel_tol=1e-12):
            raise ConfigError(
                f"clip_grad_norm({max_norm:g}) but DeepSpeed clips at gradient_clipping="
                f"{self.clip_value:g} inside engine.step(); expected the same value (the "
                "Accumulator checks this at construction). Set max_grad_norm to the config's "
                "gradient_clipping")
        if self.stage == 0 and not hasattr(self.engine.optimizer, "overflow"):
            # Plain torch optimizer: the reduced, unscaled gradient is in param.grad now.
            grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
            if not grads:
                return torch.zeros(())
            norms = torch.stack([g.detach().double().norm() for g in grads])
            total: torch.Tensor = torch.linalg.vector_norm(norms).float()
            return total
        # ZeRO 1-3 and the fp16/bf16 wrappers compute the (unscaled) global norm in step():
        # read it back from engine.get_global_grad_norm() right after (NaN until then).
        self._norm = torch.full((), math.nan)
        return self._norm

    def optimizer_step(self, optimizer: torch.optim.Optimizer | None,
                       scaler: torch.amp.GradScaler | None = None) -> None:
        if scaler is not None:
            raise ConfigError("a GradScaler cannot be used with DeepSpeed; pass scaler=None")
        self.engine.set_gradient_accumulation_boundary(True)
        with self.flush.stepping() if self.flush is not None else contextlib.nullcontext():
            self.engine.step()
        if self._norm is not None:
            norm = self.engine.get_global_grad_norm()
            if norm is not None:
                self._norm.fill_(float(norm))
            self._norm = None

    def nonfinite_grads(self, norm: torch.Tensor | None) -> torch.Tensor | None:
        """ZeRO 1-3 and the fp16/bf16 wrappers check the reduced gradient for overflow inside
        ``step()`` (one all-reduced flag, so every rank agrees) and skip the step: the
        adapter reads that back in :meth:`step_applied` instead of checking a second time.
        Stage 0 with a plain torch optimizer checks nothing: there the reduced gradient
        sits, identical on every rank, in ``param.grad`` and is checked here."""
        if hasattr(self.engine.optimizer, "overflow"):
            return None
        return super().nonfinite_grads(norm)

    def parameters_with_grad(self) -> list[torch.Tensor]:
        return [p for p in self.engine.module.parameters() if p.grad is not None]

    @property
    def dynamic_loss_scale(self) -> bool:
        return bool(self.engine.fp16_enabled())

    def step_applied(self) -> bool:
        was = getattr(self.engine, "was_step_applied", None)
        return bool(was()) if callable(was) else True

    def skip_detail(self) -> str:
        opt = self.engine.optimizer
        scale = getattr(opt, "cur_scale", None) or getattr(opt, "loss_scale", None)
        extra = f"; its fp16 loss scale is now {float(scale):g}" if (
            self.engine.fp16_enabled() and isinstance(scale, (int, float))) else ""
        return ("DeepSpeed found NaN/Inf in the reduced gradient and skipped the optimizer step "
                f"(engine.was_step_applied() is False, skipped_steps={self.engine.skipped_steps})"
                + extra)

    def zero_grad(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Nothing to do: ``engine.step()`` zeroes (or frees) the gradients at the boundary."""

    def grad_collectives(self) -> int | None:
        """Gradient-reduction *rounds* so far: backward() or sync() calls that issued at least
        one deepspeed.comm reduction (like the DDP and FSDP2 adapters, whatever the number of
        buckets). Step-time norm/overflow all-reduces are not counted."""
        return self._rounds

    def describe(self) -> str:
        memory = ", window_memory=unsharded" if self.window_memory == "unsharded" else ""
        memory += ", lean flush" if self.flush is not None else ""
        return (f"deepspeed ZeRO-{self.stage} (sync={self.sync_mode}, world={self.world_size}, "
                f"gradient_clipping={self.clip_value:g}{memory})")
