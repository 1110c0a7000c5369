"""The audit's observer: everything it sees of one loop on one rank, with no cooperation
from the loop. It installs hooks and wrappers for the duration of the loop and removes them
afterwards (see ``docs/audit.md``, "What is observed, and how"):

* global optimizer-step pre/post hooks give the gradient the optimizer receives and the LR
  it uses; nested optimizers count once; DeepSpeed's per-group inner steps merge into one;
  an ``optimizer.step()`` that finds no gradient at all is a no-op for torch optimizers and
  is counted apart (``gradless_steps``), not as a step;
* parameters are snapshotted lazily after each step (at the next forward or step or at the
  end), so engines that copy weights back after the inner step are seen right;
* forward hooks count forwards/backwards and read the compute precision (autocast, FSDP2
  ``MixedPrecisionPolicy``, TF32 switched back on by a loop on a CUDA device); collective
  wrappers count gradient reductions;
* every gradient and parameter is copied to CPU float64 as it is observed, whatever the
  loop's device, so every comparison with the (CPU fp64) reference happens on the CPU;
* ``LRScheduler.step``, ``Optimizer.zero_grad`` and ``Module.zero_grad`` are wrapped with
  ``functools.wraps``, so code that inspects their signature (Accelerate looks for
  ``set_to_none``) sees the original one.

Engine A's ``accumguard.observe`` layer will replace this module; until then the audit keeps
its own observer.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from accumguard.engines.registry import is_deepspeed_engine
from accumguard.verify.contract import LoopContext
from accumguard.verify.reference import canonical_name, flat_params
from accumguard.verify.report import LoopObservation, StepCounts

__all__ = ["Observer"]

# torch.distributed functions that reduce (gradient collectives); others are counted apart.
_REDUCE_OPS = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "_reduce_scatter_base", "reduce_scatter_single", "all_reduce_coalesced")
_OTHER_OPS = ("all_gather", "all_gather_into_tensor", "_all_gather_base", "broadcast",
              "all_gather_single", "all_to_all_single")
# The same at the deepspeed.comm level, patched once deepspeed is imported: its torch backend
# keeps its own reference to torch.distributed.reduce_scatter_tensor (ZeRO-2/3 reduce-scatters
# never reach the torch.distributed attribute), and DeepSpeed code calls these by module
# attribute on deepspeed.comm (the package) while reduce_scatter_fn calls the comm module's
# reduce_scatter_tensor: both namespaces are wrapped, a call is counted at its outermost level.
_DS_REDUCE_OPS = ("all_reduce", "inference_all_reduce", "all_reduce_coalesced", "reduce",
                  "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_fn")
_DS_OTHER_OPS = ("all_gather", "all_gather_into_tensor", "allgather_fn", "all_gather_coalesced",
                 "broadcast", "all_to_all_single")


def _gather_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full parameters by name: DTensor → ``full_tensor()``; DeepSpeed ZeRO-3 gathered."""
    params = [p for p in model.parameters()]
    if any(hasattr(p, "ds_id") and hasattr(p, "ds_tensor") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return flat_params(model)
    return flat_params(model)


def _find_wrapper(max_depth: int = 12) -> tuple[str, Any]:
    """Which engine called the model's forward: walk the caller frames for a ``self``
    that is a DDP module or a DeepSpeed engine."""
    from torch.nn.parallel import DistributedDataParallel

    f = sys._getframe(2)
    for _ in range(max_depth):
        if f is None:
            break
        obj = f.f_locals.get("self")
        if obj is not None:
            if isinstance(obj, DistributedDataParallel):
                return "ddp", obj
            if is_deepspeed_engine(obj):
                return "deepspeed", obj
        f = f.f_back
    return "", None


class Observer:
    """Everything the audit sees of one loop on one rank. Installs and removes its hooks."""

    def __init__(self, ctx: LoopContext, name: str, progress_q: Any) -> None:
        self.ctx = ctx
        self.name = name
        self.q = progress_q
        self.model = ctx.model
        self.initial = flat_params(ctx.model)
        self.pending = StepCounts()
        self.records: list[StepCounts] = []
        self.params: list[dict[str, torch.Tensor] | None] = []
        self.grads: list[dict[str, torch.Tensor] | None] = []
        self.lrs: list[list[float]] = []
        self.loss_sums: list[float] = []
        self.loss_counts: list[float] = []
        self._loss_sum = 0.0
        self._loss_count = 0.0
        self._snapshot_due = False
        self._tail_open = False
        self._opt_depth = 0
        self._sched_depth = 0
        self._zero_depth = 0
        self._observing = False
        self._interval = 0
        self._round_interval = -1
        self.engine = ""
        self.engine_info: dict[str, Any] = {}
        self.outer_optimizers: set[str] = set()
        self.notes: list[str] = []
        self.snapshot_failed: str | None = None
        self._wrapper: Any = None
        self._continuing = False
        self._undo: list[Callable[[], None]] = []
        self._comm_depth = 0
        self._engine_step_depth = 0
        self._ds_installed = False
        self._gradless = False
        self.compute_dtypes: set[str] = set()
        self.foreign_params = 0

    # -- installation ---------------------------------------------------------------
    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        try:
            self._install()
            yield
        finally:
            for undo in reversed(self._undo):
                with contextlib.suppress(Exception):
                    undo()
            self._undo.clear()

    def _patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        orig = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if orig is None:
            return
        setattr(owner, attr, make(getattr(owner, attr)))
        self._undo.append(lambda: setattr(owner, attr, orig))

    def _install(self) -> None:
        import torch.distributed as dist
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        h1 = register_optimizer_step_pre_hook(self._opt_pre)
        h2 = register_optimizer_step_post_hook(self._opt_post)
        h3 = self.model.register_forward_pre_hook(self._fwd_pre)
        h4 = self.model.register_forward_hook(self._fwd_post)
        for h in (h1, h2, h3, h4):
            self._undo.append(h.remove)
        self.ctx.on_loss = self._on_loss
        self._undo.append(lambda: setattr(self.ctx, "on_loss", None))
        for op in _REDUCE_OPS + _OTHER_OPS:
            if hasattr(dist, op):
                self._patch(dist, op, lambda orig, op=op: self._counting(orig, op in _REDUCE_OPS))
        if "deepspeed.comm.comm" in sys.modules:
            self._install_deepspeed()
        sched = torch.optim.lr_scheduler.LRScheduler
        self._patch(sched, "step", self._wrap_sched)
        self._patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero("optimizer"))
        self._patch(torch.nn.Module, "zero_grad", self._wrap_zero("module"))

    def _install_deepspeed(self) -> None:
        """Count at the deepspeed.comm level, and mark DeepSpeedEngine.step. Called at install
        when deepspeed is already imported, else at the first forward through a DeepSpeed
        engine (before any backward, so no gradient collective is missed)."""
        if self._ds_installed:
            return
        self._ds_installed = True
        for name in ("deepspeed.comm", "deepspeed.comm.comm"):
            mod = sys.modules.get(name)
            if mod is None:
                continue
            for op in _DS_REDUCE_OPS + _DS_OTHER_OPS:
                if callable(getattr(mod, op, None)):
                    self._patch(mod, op, lambda orig, op=op: self._counting(
                        orig, op in _DS_REDUCE_OPS))
        engine_mod = sys.modules.get("deepspeed.runtime.engine")
        engine_cls = getattr(engine_mod, "DeepSpeedEngine", None)
        if engine_cls is not None:
            self._patch(engine_cls, "step", self._wrap_engine_step)

    def _wrap_engine_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        obs = self

        @functools.wraps(orig)
        def step(engine: Any, *args: Any, **kwargs: Any) -> Any:
            obs._engine_step_depth += 1
            try:
                return orig(engine, *args, **kwargs)
            finally:
                obs._engine_step_depth -= 1

        return step

    def _counting(self, orig: Callable[..., Any], reduces: bool) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            # Only the outermost call counts: deepspeed.comm calls torch.distributed, and
            # reduce_scatter_fn calls reduce_scatter_tensor.
            if self._observing or self._comm_depth:
                return orig(*args, **kwargs)
            if reduces and self._engine_step_depth:
                self.pending.step_reduce_calls += 1
            elif reduces and self.pending.backward > 0:
                self.pending.grad_collective_calls += 1
                self._mark_round()
            else:
                self.pending.other_collective_calls += 1
            self._comm_depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                self._comm_depth -= 1

        return wrapped

    def _wrap_sched(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        obs = self

        @functools.wraps(orig)
        def step(sched: Any, *args: Any, **kwargs: Any) -> Any:
            # The constructor's initial step (``_step_count`` still 0) is not a training step.
            counted = getattr(sched, "_step_count", 0) > 0 and obs._sched_depth == 0
            obs._sched_depth += 1
            try:
                return orig(sched, *args, **kwargs)
            finally:
                obs._sched_depth -= 1
                if counted:
                    obs._tail_or_pending().scheduler_steps += 1

        return step

    def _wrap_zero(self, kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        obs = self

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            # functools.wraps keeps the signature visible to inspect.signature: Accelerate
            # passes set_to_none only when the optimizer's zero_grad declares it.
            @functools.wraps(orig)
            def zero_grad(this: Any, *args: Any, **kwargs: Any) -> Any:
                outer = obs._zero_depth == 0
                obs._zero_depth += 1
                try:
                    return orig(this, *args, **kwargs)
                finally:
                    obs._zero_depth -= 1
                    if outer and (kind == "optimizer" or this is obs.model
                                  or _owns(this, obs.model)):
                        target = obs._tail_or_pending()
                        target.zero_grad += 1
                        if target is obs.pending and obs.pending.backward > 0:
                            obs.pending.zero_grad_in_window += 1

            return zero_grad

        return make

    # -- events ------------------------------------------------------------------------
    def _tail_or_pending(self) -> StepCounts:
        return self.records[-1] if self._tail_open and self.records else self.pending

    def _mark_round(self) -> None:
        if self._round_interval != self._interval:
            self._round_interval = self._interval
            self.pending.grad_collective_rounds += 1

    def _on_loss(self, loss: Any, count: Any) -> None:
        with contextlib.suppress(Exception):
            self._loss_sum += float(loss.detach().float().sum())
            self._loss_count += float(torch.as_tensor(count).float().sum())
            self.pending.loss_calls += 1

    def _fwd_pre(self, module: Any, args: Any) -> None:
        if not torch.is_grad_enabled():
            return
        self._take_snapshot()
        self._tail_open = False
        self.pending.forward += 1
        self._note_precision(module)
        kind, wrapper = _find_wrapper()
        self._ddp_sync = False
        if kind:
            self._note_engine(kind, wrapper)
        if kind == "ddp":
            self._ddp_sync = bool(getattr(wrapper, "require_backward_grad_sync", True))

    def _fwd_post(self, module: Any, args: Any, output: Any) -> None:
        if not torch.is_grad_enabled():
            return
        t = _first_grad_tensor(output)
        if t is None:
            return
        synced = getattr(self, "_ddp_sync", False)

        def on_grad(grad: torch.Tensor) -> None:
            self._interval += 1
            self._tail_open = False
            self.pending.backward += 1
            if synced:
                self.pending.ddp_sync_rounds += 1
                self._mark_round()

        t.register_hook(on_grad)

    def _note_precision(self, module: Any) -> None:
        """Record the compute precision of this forward: autocast, FSDP2 mixed precision."""
        for device in ("cpu", "cuda"):
            with contextlib.suppress(Exception):
                if torch.is_autocast_enabled(device):
                    dt = torch.get_autocast_dtype(device)
                    self.compute_dtypes.add(f"autocast {str(dt).replace('torch.', '')}")
        if self.ctx.device.type == "cuda" and (torch.backends.cuda.matmul.allow_tf32
                                               or torch.backends.cudnn.allow_tf32):
            # The audit switched TF32 off; the loop switched it back on. TF32 keeps fp16's
            # 10-bit mantissa, so the compute precision (and the tolerance, which names
            # this source) is judged as float16's: the last word is what is parsed.
            self.compute_dtypes.add("TF32 switched on by the loop (10-bit mantissa) ~ float16")
        with contextlib.suppress(Exception):
            policy = module._get_fsdp_state()._mp_policy
            if policy.param_dtype is not None:
                self.compute_dtypes.add(
                    f"fsdp2 mixed precision {str(policy.param_dtype).replace('torch.', '')}")

    def _note_engine(self, kind: str, wrapper: Any) -> None:
        if self.engine:
            return
        self.engine = kind
        self._wrapper = wrapper
        if kind == "deepspeed":
            self._install_deepspeed()
            with contextlib.suppress(Exception):
                self.engine_info = {
                    "zero_stage": int(wrapper.zero_optimization_stage()),
                    "gradient_accumulation_steps": int(wrapper.gradient_accumulation_steps()),
                    "gradient_clipping": float(wrapper.gradient_clipping() or 0.0),
                }

    def _opt_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth += 1
        if self._opt_depth > 1:
            return
        # DeepSpeed ZeRO-1/2 steps its inner optimizer once per parameter group, back to back:
        # with no forward/backward in between, it is the same optimizer step.
        self._continuing = (self.engine == "deepspeed" and bool(self.records)
                            and self._snapshot_due and self.pending.backward == 0
                            and self.pending.forward == 0)
        if self._continuing:
            more = self._capture_grads(opt)
            if more and self.grads and self.grads[-1] is not None:
                self.grads[-1].update(more)
            return
        self._gradless = (self.engine != "deepspeed" and all(
            p.grad is None for g in opt.param_groups for p in g["params"]))
        if self._gradless:
            # torch optimizers skip parameters without a gradient: this step changes nothing
            # (FSDP2 between unsynchronised micro-steps). Counted apart, not as a step.
            return
        self._take_snapshot()
        self._interval += 1
        self.outer_optimizers.add(type(opt).__name__)
        self.lrs.append([float(g.get("lr", float("nan"))) for g in opt.param_groups])
        self.grads.append(self._capture_grads(opt))

    def _opt_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth -= 1
        if self._opt_depth > 0 or self._continuing:
            self._continuing = False if self._opt_depth == 0 else self._continuing
            return
        if self._gradless:
            self._gradless = False
            self.pending.gradless_steps += 1
            return
        self.pending.optimizer_steps += 1
        self.records.append(self.pending)
        self.pending = StepCounts()
        self.loss_sums.append(self._loss_sum)
        self.loss_counts.append(self._loss_count)
        self._loss_sum = self._loss_count = 0.0
        self.params.append(None)
        self._snapshot_due = True
        self._tail_open = True
        if self.q is not None:
            with contextlib.suppress(Exception):
                self.q.put((self.name, len(self.records)))

    def _capture_grads(self, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor] | None:
        names = {id(p): canonical_name(n) for n, p in self.model.named_parameters()}
        out: dict[str, torch.Tensor] = {}
        self._observing = True
        try:
            for group in opt.param_groups:
                for p in group["params"]:
                    name = names.get(id(p))
                    if name is None:
                        self.foreign_params += 1
                        continue
                    g = p.grad
                    if g is None:
                        out[name] = torch.zeros(tuple(p.shape), dtype=torch.float64)
                        continue
                    g = g.detach()
                    if hasattr(g, "full_tensor"):
                        g = g.full_tensor()
                    out[name] = g.to("cpu", torch.float64).clone()
        finally:
            self._observing = False
        if not out and self.engine == "deepspeed":
            self._observing = True
            try:
                return self._capture_zero_partitions(opt, names)
            except Exception as exc:  # noqa: BLE001 - fall back to comparing updates only
                self.notes.append(f"could not gather DeepSpeed gradient partitions: {exc}")
                return None
            finally:
                self._observing = False
        return out or None

    def _capture_zero_partitions(self, opt: torch.optim.Optimizer,
                                 names: dict[int, str]) -> dict[str, torch.Tensor] | None:
        """DeepSpeed ZeRO-1/2: the inner optimizer holds this rank's flat fp32 partition of
        each parameter group. All-gather the partitions' gradients over the data-parallel
        group and cut the flat buffer back into parameters (per-parameter alignment padding
        after each, group padding at the end). ZeRO-3 and others: not observable (None)."""
        import torch.distributed as dist

        zopt = getattr(self._wrapper, "optimizer", None)
        parts = getattr(zopt, "single_partition_of_fp32_groups", None)
        groups = getattr(zopt, "round_robin_bit16_groups", None)
        paddings = getattr(zopt, "round_robin_bit16_padding", None)
        pgs = getattr(zopt, "real_dp_process_group", None)
        if parts is None or groups is None or pgs is None:
            return None
        mine = {id(p) for g in opt.param_groups for p in g["params"]}
        out: dict[str, torch.Tensor] = {}
        for i, part in enumerate(parts):
            if id(part) not in mine or part.grad is None:
                continue
            world = dist.get_world_size(pgs[i])
            pieces = [torch.empty_like(part.grad) for _ in range(world)]
            dist.all_gather(pieces, part.grad.detach().contiguous(), group=pgs[i])
            flat = torch.cat([x.reshape(-1) for x in pieces]).to("cpu", torch.float64)
            pads = paddings[i] if paddings is not None else [0] * len(groups[i])
            offset = 0
            for p, pad in zip(groups[i], pads, strict=True):
                n = p.numel() if not hasattr(p, "ds_numel") else p.ds_numel
                name = names.get(id(p))
                if name is not None:
                    out[name] = flat[offset:offset + n].reshape(tuple(p.shape)).clone()
                offset += n + pad
        return out or None

    def _take_snapshot(self) -> None:
        if not self._snapshot_due:
            return
        self._snapshot_due = False
        self._observing = True
        try:
            self.params[-1] = _gather_params(self.model)
        except Exception as exc:  # noqa: BLE001 - reported, the loop continues
            self.snapshot_failed = f"{type(exc).__name__}: {exc}"
        finally:
            self._observing = False

    def finish(self) -> None:
        self._take_snapshot()

    def result(self) -> LoopObservation:
        try:
            from torch.distributed.fsdp import FSDPModule

            if isinstance(self.model, FSDPModule):
                self.engine = self.engine or "fsdp2"
        except ImportError:  # pragma: no cover
            pass
        if "ZeroRedundancyOptimizer" in self.outer_optimizers:
            self.engine = "zero1"
        if not self.engine:
            import torch.distributed as dist

            self.engine = "local" if not (dist.is_initialized() and dist.get_world_size() > 1) \
                else "custom"
        dtypes = {str(p.dtype).replace("torch.", "") for p in self.model.parameters()}
        return LoopObservation(
            name=self.name, initial=self.initial, params=self.params, grads=self.grads,
            lrs=self.lrs, records=self.records, trailing=self.pending,
            loss_sums=self.loss_sums, loss_counts=self.loss_counts, engine=self.engine,
            engine_info=self.engine_info, outer_optimizers=sorted(self.outer_optimizers),
            param_dtypes=sorted(dtypes), snapshot_failed=self.snapshot_failed,
            notes=list(dict.fromkeys(self.notes)), compute_dtypes=sorted(self.compute_dtypes),
            foreign_params=0 if self.engine == "deepspeed" else self.foreign_params)


def _owns(module: Any, model: torch.nn.Module) -> bool:
    """Whether ``module`` wraps ``model`` (DDP / DeepSpeed engine ``.module``)."""
    return getattr(module, "module", None) is model


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    values: Any = ()
    if isinstance(output, dict):
        values = output.values()
    elif isinstance(output, (list, tuple)):
        values = output
    elif hasattr(output, "__dict__"):
        values = vars(output).values()
    for v in values:
        t = _first_grad_tensor(v)
        if t is not None:
            return t
    return None


