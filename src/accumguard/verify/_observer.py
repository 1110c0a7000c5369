"""The audit's observer: everything it sees of one loop on one rank, with no cooperation
from the loop (see ``docs/audit.md``, "What is observed, and how").

What the loop does is observed by the one observation layer, :mod:`accumguard.observe`
(backward passes of any kind, optimizer steps including DeepSpeed's ``engine.step`` and
wrapping optimizers, ``zero_grad``, LR-scheduler steps, collectives counted where they are
issued, DDP's gradient-sync flag at forward time, the DeepSpeed config); this module is one
of its listeners and turns its events into the audit's per-step counts, one window record
(:class:`~accumguard.core.window.StepRecord`) per optimizer step. What only the audit needs
stays here:

* the gradient the optimizer receives, copied when the (innermost) torch optimizer steps,
  including DeepSpeed ZeRO-1/2's flat fp32 partitions (all-gathered and cut back into
  parameters); DeepSpeed's per-group inner steps within one ``engine.step`` merge into one;
  an ``optimizer.step()`` that finds no gradient at all is a no-op for torch optimizers and
  is counted apart (``gradless_steps``), not as a step;
* the parameters after each step, snapshotted lazily (at the next forward or step or at
  the end, so engines that copy weights back after the inner step are seen right; FSDP2
  ``full_tensor`` and DeepSpeed ZeRO-3 ``GatheredParameters``);
* the forward count and compute precision of the model under audit (autocast, FSDP2
  ``MixedPrecisionPolicy``, TF32 switched back on by a loop on a CUDA device);
* every gradient and parameter is copied to CPU float64 as it is observed, whatever the
  loop's device, so every comparison with the (CPU fp64) reference happens on the CPU.

The audit's own collectives (gathering partitions and parameters) are not counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Protocol

import torch

from accumguard.core.window import StepRecord
from accumguard.observe import Observer as Layer
from accumguard.observe._events import (
    BackwardEvent,
    CollectiveEvent,
    EngineInfo,
    EngineStepEvent,
    ForwardEvent,
    OptimizerCallEvent,
    SchedulerEvent,
    StepEvent,
    ZeroGradEvent,
)
from accumguard.observe._hookref import ModuleHook
from accumguard.verify.contract import LoopContext
from accumguard.verify.reference import canonical_name, flat_params
from accumguard.verify.report import LoopObservation

__all__ = ["Observer"]

# Collectives that move no tensor data of the model: not in the audit's counts.
_NOT_COUNTED = frozenset({"barrier"})


class _Progress(Protocol):
    """Where the audit reports (loop name, optimizer steps so far): a multiprocessing queue."""

    def put(self, item: tuple[str, int], /) -> None: ...


def _gather_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full parameters by name: DTensor → ``full_tensor()``; DeepSpeed ZeRO-3 gathered."""
    params = [p for p in model.parameters()]
    if any(hasattr(p, "ds_id") and hasattr(p, "ds_tensor") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return flat_params(model)
    return flat_params(model)


class Observer:
    """Everything the audit sees of one loop on one rank: a listener of the observation
    layer plus the audit's own gradient and parameter copies."""

    def __init__(self, ctx: LoopContext, name: str, progress_q: _Progress | None) -> None:
        self.ctx = ctx
        self.name = name
        self.q = progress_q
        self.model = ctx.model
        self.initial = flat_params(ctx.model)
        # the open window's counts, by StepRecord field (frozen into a record at the step)
        self.pending: Counter[str] = Counter()
        self.records: list[StepRecord] = []
        self.params: list[dict[str, torch.Tensor] | None] = []
        self.grads: list[dict[str, torch.Tensor] | None] = []
        self.lrs: list[list[float]] = []
        self.loss_sums: list[float] = []
        self.loss_counts: list[float] = []
        self._loss_sum = 0.0
        self._loss_count = 0.0
        self._snapshot_due = False
        self._tail_open = False
        self._interval = 0
        self._round_interval = -1
        self.engine = ""
        self.engine_info: dict[str, int | float] = {}
        self.outer_optimizers: set[str] = set()
        self.notes: list[str] = []
        self.snapshot_failed: str | None = None
        self._wrapper: torch.nn.Module | None = None  # the DeepSpeed engine
        self._root: tuple[str, bool | None] = ("", None)  # last top-level forward: kind, sync
        self._ddp_sync = False  # DDP's sync flag at the model's latest forward
        self._ds_captured = False  # the inner optimizer stepped in this engine.step
        self._gradless = False
        self.compute_dtypes: set[str] = set()
        self.foreign_params = 0
        self.layer = Layer(auto_roots=True, conservation=False)
        self.layer.add_listener(self)

    # -- installation ---------------------------------------------------------------
    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        handles = []
        try:
            self.layer.install()
            handles.append(self.model.register_forward_pre_hook(ModuleHook(self._fwd_pre)))
            self.ctx.on_loss = self._on_loss
            yield
        finally:
            for h in handles:
                with contextlib.suppress(Exception):
                    h.remove()
            self.ctx.on_loss = None
            self.layer.uninstall()

    @contextlib.contextmanager
    def _own_work(self) -> Iterator[None]:
        """The audit's own collectives (gathering partitions, parameters): not counted."""
        with self.layer.counter.paused():
            yield

    # -- the observation layer's events ---------------------------------------------------
    def on_forward(self, ev: ForwardEvent) -> None:
        # A top-level forward (DDP module, DeepSpeed engine, or the model itself): it runs
        # before the model's own forward pre-hook, which reads it.
        self._root = (ev.engine if ev.engine in ("ddp", "deepspeed") else "", ev.sync)
        if ev.engine == "deepspeed":
            self._wrapper = ev.module

    def on_engine(self, info: EngineInfo) -> None:
        if info.engine == "deepspeed" and not self.engine_info:
            self.engine_info = {
                "zero_stage": int(info.zero_stage or 0),
                "gradient_accumulation_steps": int(info.gradient_accumulation_steps or 1),
                "gradient_clipping": float(info.gradient_clipping or 0.0),
            }

    def on_backward_start(self, ev: BackwardEvent) -> None:
        self._interval += 1
        self._tail_open = False
        self.pending["backwards"] += 1
        if self._ddp_sync:
            self.pending["ddp_sync_rounds"] += 1
            self._mark_round()

    def on_collective(self, ev: CollectiveEvent) -> None:
        if ev.op in _NOT_COUNTED:
            return
        if ev.reduces and ev.in_engine:
            self.pending["step_reduce_calls"] += 1
        elif ev.reduces and self.pending["backwards"] > 0:
            self.pending["reductions"] += 1
            self._mark_round()
        else:
            self.pending["other_collective_calls"] += 1

    def on_zero_grad(self, ev: ZeroGradEvent) -> None:
        this = ev.owner
        mine = ev.kind == "optimizer" or this is self.model or _owns(this, self.model)
        if mine and not self._count_on_tail("zero_grad_calls"):
            self.pending["zero_grad_calls"] += 1
            if self.pending["backwards"] > 0:
                self.pending["zero_grads"] += 1

    def on_scheduler_step(self, ev: SchedulerEvent) -> None:
        if not self._count_on_tail("scheduler_steps"):
            self.pending["scheduler_steps"] += 1

    def on_engine_step(self, ev: EngineStepEvent) -> None:
        self._wrapper = ev.owner
        self._ds_captured = False

    def on_optimizer_call(self, ev: OptimizerCallEvent) -> None:
        """The gradient the optimizer receives: copied at the outermost torch step, or at
        the inner optimizer's first (per-group) step inside a DeepSpeed ``engine.step``."""
        opt = ev.owner
        if ev.depth != 1:
            return
        assert opt is not None  # (the observation layer names the optimizer it wraps)
        if ev.in_engine:
            if self._ds_captured:  # the next parameter group of the same step
                more = self._capture_grads(opt)
                if more and self.grads and self.grads[-1] is not None:
                    self.grads[-1].update(more)
                return
            self._ds_captured = True
        else:
            self._gradless = all(p.grad is None for g in opt.param_groups for p in g["params"])
            if self._gradless:
                # torch optimizers skip parameters without a gradient: this step changes
                # nothing (FSDP2 between unsynchronised micro-steps). Counted apart.
                return
        self._take_snapshot()
        self._interval += 1
        self.outer_optimizers.add(type(opt).__name__)
        self.lrs.append([float(g.get("lr", float("nan"))) for g in opt.param_groups])
        self.grads.append(self._capture_grads(opt))

    def on_step(self, ev: StepEvent) -> None:
        if ev.source == "deepspeed":
            stepped = self._ds_captured
            self._ds_captured = False
            if not stepped:  # no inner optimizer step (an overflow skip): no update seen
                return
        elif self._gradless:
            self._gradless = False
            self.pending["gradless_steps"] += 1
            return
        self.records.append(_record(len(self.records), self.pending, optimizer_steps=1))
        self.pending = Counter()
        self.loss_sums.append(self._loss_sum)
        self.loss_counts.append(self._loss_count)
        self._loss_sum = self._loss_count = 0.0
        self.params.append(None)
        self._snapshot_due = True
        self._tail_open = True
        if self.q is not None:
            with contextlib.suppress(Exception):
                self.q.put((self.name, len(self.records)))

    # -- the audit's own hooks ---------------------------------------------------------------
    def _count_on_tail(self, name: str) -> bool:
        """Boundary work right after a step (before the next forward or backward) belongs
        to that step: count one more ``name`` on its record (True), else nothing (False)."""
        if not (self._tail_open and self.records):
            return False
        last = self.records[-1]
        self.records[-1] = dataclasses.replace(last, **{name: getattr(last, name) + 1})
        return True

    def _mark_round(self) -> None:
        if self._round_interval != self._interval:
            self._round_interval = self._interval
            self.pending["reduction_rounds"] += 1

    def _on_loss(self, loss: torch.Tensor, count: object) -> None:
        with contextlib.suppress(Exception):
            self._loss_sum += float(loss.detach().float().sum())
            self._loss_count += float(torch.as_tensor(count).float().sum())
            self.pending["loss_calls"] += 1

    def _fwd_pre(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        if not torch.is_grad_enabled():
            return
        self._take_snapshot()
        self._tail_open = False
        self.pending["forward_calls"] += 1
        self._note_precision(module)
        kind, sync = self._root
        self._root = ("", None)
        if kind and not self.engine:
            self.engine = kind
        # DDP decides at forward time whether this micro-step's backward all-reduces.
        self._ddp_sync = kind == "ddp" and bool(sync if sync is not None else True)

    def _note_precision(self, module: torch.nn.Module) -> None:
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
            # FSDP2's fully_shard adds the method (another module: AttributeError, suppressed)
            policy = getattr(module, "_get_fsdp_state")()._mp_policy  # noqa: B009
            if policy.param_dtype is not None:
                self.compute_dtypes.add(
                    f"fsdp2 mixed precision {str(policy.param_dtype).replace('torch.', '')}")

    # -- gradients and parameters --------------------------------------------------------------
    def _capture_grads(self, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor] | None:
        names = {id(p): canonical_name(n) for n, p in self.model.named_parameters()}
        out: dict[str, torch.Tensor] = {}
        with self._own_work():
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
            if not out and self.engine == "deepspeed":
                try:
                    return self._capture_zero_partitions(opt, names)
                except Exception as exc:  # noqa: BLE001 - fall back to comparing updates only
                    self.notes.append(f"could not gather DeepSpeed gradient partitions: {exc}")
                    return None
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
        try:
            with self._own_work():
                self.params[-1] = _gather_params(self.model)
        except Exception as exc:  # noqa: BLE001 - reported, the loop continues
            self.snapshot_failed = f"{type(exc).__name__}: {exc}"

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
            lrs=self.lrs, records=self.records,
            trailing=_record(len(self.records), self.pending, optimizer_steps=0),
            loss_sums=self.loss_sums, loss_counts=self.loss_counts, engine=self.engine,
            engine_info=self.engine_info, outer_optimizers=sorted(self.outer_optimizers),
            param_dtypes=sorted(dtypes), snapshot_failed=self.snapshot_failed,
            notes=list(dict.fromkeys(self.notes)), compute_dtypes=sorted(self.compute_dtypes),
            foreign_params=0 if self.engine == "deepspeed" else self.foreign_params)


def _record(step: int, counts: Mapping[str, int], *, optimizer_steps: int) -> StepRecord:
    """The window record of the audit's counts (keys: :class:`StepRecord` fields)."""
    return StepRecord.of_counts(step, {**counts, "optimizer_steps": optimizer_steps})


def _owns(module: object, model: torch.nn.Module) -> bool:
    """Whether ``module`` wraps ``model`` (DDP / DeepSpeed engine ``.module``)."""
    return getattr(module, "module", None) is model
