"""The observer: one set of patches and hooks that turns a training process into events.

What is observed (each patch keeps the signature and is undone on :meth:`Observer.uninstall`):

* forwards of the model: hooks on the modules given, or (``auto_roots``) the outermost
  module call, with DDP's/FSDP2's gradient-sync flag read there (:mod:`._forwards`);
* backwards: ``Tensor.backward``, ``torch.autograd.backward``, DeepSpeed's ``engine.backward``,
  Accelerate's ``accelerator.backward`` (the outermost call is one backward pass);
* optimizer steps: torch's global step hooks (the outermost step: a wrapper steps an inner
  optimizer) and ``DeepSpeedEngine.step`` (a step only when the engine really updated);
* ``zero_grad``, LR-scheduler steps, clipping, GradScaler, DataLoader passes
  (:mod:`._patch_torch`, :mod:`._patch_deepspeed`, :mod:`._patch_accelerate`,
  :mod:`._patch_trainers` with the K the frameworks declare), gradient collectives
  (:mod:`._collectives`), loss calls and their token weights (:mod:`._losses`);
* gradient checksums around each backward and at the step, for the conservation verdict
  (:mod:`._checksum`), where gradients live in ``.grad`` (not DeepSpeed ZeRO >= 1).

The patches call back into this class (``_run_backward``, ``_begin_step``/``_end_step``,
``_count_sched``, ``_emit``): the per-micro-step/per-step work and the event dispatch stay
here, with the lifecycle and the arming of sampled windows. Which backward reaches a root is
:mod:`._attribution`; a window and the step record it becomes, :mod:`._window`.

Events go to listeners (the guard, ``watch``'s recorder). A listener may raise from
``on_step_start``/``on_backward_start``/``on_zero_grad``/``on_scheduler_step``/
``on_clip`` to stop the action before it happens (the guard does).
"""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from accumguard.observe import _patch_accelerate, _patch_deepspeed, _patch_torch, _patch_trainers
from accumguard.observe._attribution import Attribution
from accumguard.observe._boundary import BoundaryScale
from accumguard.observe._checksum import (
    FORCED_CHECKS,
    checksums,
    conservation,
    grad_versions,
    sampled,
)
from accumguard.observe._collectives import CollectiveCounter
from accumguard.observe._events import (
    BackwardEvent,
    CollectiveEvent,
    EngineInfo,
    OptimizerCallEvent,
    ScalerEvent,
    SchedulerEvent,
    StepStartEvent,
)
from accumguard.observe._failsafe import Failsafe, Failure, hook_method
from accumguard.observe._forwards import ForwardHooks
from accumguard.observe._imports import when_imported as _when_imported
from accumguard.observe._introspect import (
    local,
    param_dtype,
    snapshot,
    tol_for,
)
from accumguard.observe._lanes import Lanes
from accumguard.observe._losses import LossRecorder
from accumguard.observe._patch import Patches
from accumguard.observe._precision import (
    deepspeed_dtypes,
    fsdp_dtypes,
    least_precise,
    model_grad_sum,
    name_of,
    step_facts,
)
from accumguard.observe._reduction import rank_factor
from accumguard.observe._tally import Tally
from accumguard.observe._window import Window

__all__ = ["Observer"]

#: The listener methods the observer calls (see :class:`._events.Listener`).
_EVENT_METHODS = ("on_forward", "on_backward_start", "on_backward", "on_collective",
                  "on_optimizer_call", "on_step_start", "on_step", "on_engine_step",
                  "on_engine", "on_zero_grad", "on_scheduler_step", "on_clip", "on_unscale",
                  "on_scaler_update", "on_scaler_skip", "on_internal_error")


#: The row of a tracked parameter that was replaced and dropped (no gradient, checksum 0).
_GONE = torch.empty(0)

#: ``auto_roots``: optimizer steps after which the modules seen at the top level are hooked
#: one by one instead of through the global forward pre-hook (:meth:`Observer._pin_roots`).
PIN_ROOTS_AFTER_STEPS = 2


class Observer(ForwardHooks):
    """Installs the observation layer in this process and reports events to listeners.

    Args:
        roots: modules to watch (forward hooks on them). ``None`` with ``auto_roots``
            watches the outermost module of every forward.
        auto_roots: use a global forward hook (``watch``); the guard passes its model.
        conservation: take gradient checksums for the conservation verdict.
        record_updates: keep each applied step's parameter update (float64 CPU, local
            shards) on the step event.
        every: check conservation on every N-th window only (cost control).
        budget: with ``every=1``, skip windows while the checksums have cost more than
            this fraction of the run's wall time (the first windows are always checked).
        attribute: with ``roots``, mark each backward that reaches the output of a root's
            forward (``BackwardEvent.reached``): the guard counts only its model's backwards.
        record_losses: patch the loss functions for the loss record (:mod:`._losses`, the
            F5 rule of ``watch``); the framework callbacks, which probe the logits for the
            same question, turn it off (it costs a frame walk and a hook per loss call).
        window_loss: keep each backward's scalar loss for the step record's ``window_loss``
            (one host read per step); listeners that never read it (the framework
            callbacks) turn it off.
        sampled_records: observe fully only the sampled windows (one in ``every``,
            :func:`~accumguard.observe._checksum.sampled`) and the ``FORCED_CHECKS`` windows
            after one that zeroed gradients between backwards without a conservation
            verdict (an epoch's reset, a leftover). The other windows have no hooks on the
            given roots (``auto_roots`` keeps its global hook), no conservation check and
            no sync flags; their step record (``on_step``) is emitted only when what is
            counted without hooks is unusual (a zero_grad or a DataLoader pass between
            backwards, a clip before the last backward, a backward count other than
            ``window_size``). For listeners whose contract is "check one step in N" (the
            framework callbacks): the root hooks and the record cost about 1 % of a
            demo-LM step.
        window_size: K, for ``sampled_records`` (see there); None: not judged.
        failsafe: the door of every patch and hook (:mod:`._failsafe`), shared with the
            listener's own hooks (the framework callbacks); default: the observer's own.
        boundary_param: a parameter whose gradient's scale between the last backward and
            the first clip (or the step) is measured on checked windows
            (:meth:`boundary_scale`; the framework callbacks pass the logits layer's weight).
    """

    def __init__(self, roots: Iterable[torch.nn.Module] | None = None, *,
                 auto_roots: bool = False, conservation: bool = True,
                 record_updates: bool = False, every: int = 1,
                 budget: float | None = None, attribute: bool = False,
                 record_losses: bool = True, window_loss: bool = True,
                 sampled_records: bool = False, window_size: int | None = None,
                 boundary_param: torch.Tensor | None = None,
                 failsafe: Failsafe | None = None) -> None:
        self.listeners: list[Any] = []
        # method name -> bound listener methods (every name of _EVENT_METHODS)
        self._handlers: dict[str, list[Any]] = {m: [] for m in _EVENT_METHODS}
        self._wants_backwards = False
        self._dtypes: dict[int, str | None] = {}
        self.roots: dict[int, torch.nn.Module] = {}
        self._sync_roots: list[Any] = []  # roots with a gradient-sync flag (DDP, FSDP2)
        self._given_roots = list(roots or [])
        self.auto_roots = auto_roots
        self.check_conservation = conservation
        self.record_updates = record_updates
        self.every = max(1, int(every))
        self.budget = budget
        self._t_start = time.perf_counter()
        self._t_checks = 0.0
        self._window_checked: bool | None = None
        self.attribute = attribute
        self.record_losses = record_losses
        self.window_loss = window_loss
        self.sampled_records = sampled_records
        self.window_size = window_size
        self.boundary = BoundaryScale(boundary_param) if boundary_param is not None else None
        self._armed = True  # this window is sampled (always, without sampled_records)
        self._root_handles: list[Any] = []
        self.force_checks = 0  # check conservation on the next N windows whatever the budget
        self._attribution = Attribution(self._reach)  # which backwards reach a root
        self._step_cons: Any = None
        self._scaler_depth = 0
        self._clip_depth = 0
        self.step = 0  # optimizer steps recorded
        # every patch and hook runs behind its door: an internal error switches observation
        # off (listeners hear ``on_internal_error``), never the user's run
        self.failsafe = failsafe if failsafe is not None else Failsafe(step=lambda: self.step)
        self.failsafe.on_failure(self._failed)
        self.failsafe.on_teardown(self.uninstall)
        self.patches = Patches(self.failsafe)
        self.counter = CollectiveCounter(self._on_collective, failsafe=self.failsafe)
        self.losses = LossRecorder(self)  # cross-entropy calls and their token weights (F5)
        self.counter.position = self._collective_position
        self.installed = False
        self.backward_total = 0
        self.engine = "local"
        self.engine_info: EngineInfo | None = None
        self.declared_k: dict[str, int] = {}
        self._w = Window()
        # several optimizers over disjoint parameters: each one's own window (:mod:`._lanes`)
        self.lanes = Lanes()
        self._ow: Window | None = None  # the stepping optimizer's own window, if not self._w
        self._fwd_depth = 0
        # modules called at the top level -> their depth-counting post hook (weak: a loss
        # module built on every step takes its hook with it when it is freed)
        self._depth_hooked: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._hooked_ids: set[int] = set()  # fast negative test for the map above
        self._global_handle: Any = None  # auto_roots: the global pre-hook until pinned
        self._pinned: list[Any] = []  # auto_roots: per-root pre-hooks after pinning
        self._pinned_any = False  # _pin_roots ran (a DDP built later is hooked on its own)
        self._bw_depth = 0
        self._bw_current: BackwardEvent | None = None
        self._opt_depth = 0
        self._ds_step_depth = 0
        self._inner_stepped = False
        self._sched_depth = 0
        self._in_data_pass = 0
        self._accel_sched_inner = 0
        self._zero_depth = 0
        self._in_observer = 0
        self._last_sync_forward: bool | None = None
        self._sync_root: Any = None  # the last DDP/FSDP2 root whose forward ran
        self._tracked: list[torch.Tensor] = []
        self._end_versions: list[tuple[int, int] | None] = []
        self._tracked_names: dict[int, str] = {}
        self._tracked_ids: set[int] = set()
        self._fsdp_groups: dict[int, list[Any]] = {}
        self._ds_engine: Any = None
        self._sched_counts = Tally()
        self._opt_steps = Tally()
        self._before: dict[str, torch.Tensor] | None = None
        self._idle_before: dict[str, torch.Tensor] | None = None  # see _begin_step
        self._last_owner = 0  # id() of the optimizer/engine of the previous step
        self._last_grads: list[tuple[int, int]] = []  # its gradients then: (id, version)
        self._step_checksum: torch.Tensor | None = None
        self._step_members: list[bool] | None = None
        self._step_master: dict[str, Any] | None = None  # see _precision.model_grad_sum
        self._prec_static: dict[tuple[int, int], tuple[Any, ...]] = {}
        self._step_applied = True
        self._step_closure = False  # the step at hand got a closure and no gradient before it
        self._step_t0 = 0.0

    # -- lifecycle ------------------------------------------------------------------------
    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)
        # every event kind's bound methods, looked up once here (hot paths index the map)
        self._handlers = {m: [fn for fn in (getattr(x, m, None) for x in self.listeners) if fn]
                          for m in _EVENT_METHODS}
        self._wants_backwards = bool(self._handlers["on_backward"]
                                     or self._handlers["on_backward_start"])

    @property
    def failure(self) -> Failure | None:
        """accumguard's own failure on this process (observation off since), or None."""
        return self.failsafe.failure

    def install(self) -> Observer:
        """Install every patch and hook; an internal error while doing so undoes them and is
        recorded as :attr:`failure` (the caller's program goes on unobserved)."""
        if self.installed or not self.failsafe.ok:
            return self
        self.failsafe.guard("install", self._install)
        return self

    def _install(self) -> None:
        self.installed = True
        from torch.nn.modules import module as module_mod

        p = self.patches
        for m in self._given_roots:
            self._add_root(m)
        self._armed = True
        self._hook_roots(True)
        p.add(lambda: self._hook_roots(False))
        if self.auto_roots:
            # one global pre-hook; the depth (which call is top level) is kept by a post
            # hook on the modules seen at the top level only, not on every submodule call.
            # After PIN_ROOTS_AFTER_STEPS steps it is replaced by pre-hooks on those modules
            # (:meth:`_pin_roots`): a global hook sends every submodule call down torch's
            # slower hooked path (a no-op one costs 2 % per step on the demo LM).
            self._global_handle = module_mod.register_module_forward_pre_hook(
                self._global_pre)
            p.add(self._remove_root_hooks)
        _patch_torch.install(self, p)  # step hooks, backward, zero_grad, DataLoader
        if self.record_losses:
            self.losses.install(p)
        _patch_torch.install_after_losses(self, p)  # schedulers, clipping, GradScaler
        if torch.distributed.is_available():
            self.counter.install_torch()
        p.add(self.counter.uninstall)
        self._hook_libraries()

    def uninstall(self) -> None:
        self.installed = False
        self.patches.undo()
        for handle in list(self._depth_hooked.values()):
            handle.remove()
        self._depth_hooked.clear()
        self._hooked_ids.clear()
        self._fwd_depth = 0
        self._attribution.reset()
        self._sync_root, self._pinned_any = None, False  # no reference to the user's model

    def __enter__(self) -> Observer:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def _failed(self, failure: Failure) -> None:
        """The failsafe tripped: tell the listeners (their own errors are ignored there)."""
        for fn in self._handlers["on_internal_error"]:
            fn(failure)

    def _hook_libraries(self) -> None:
        """Patch DeepSpeed, Accelerate, HF and Lightning when (if) they are imported."""
        fs = self.failsafe

        lib = functools.partial

        def when_imported(name: str, fn: Callable[[Any], Any]) -> None:
            _when_imported(name, lambda module: fs.guard(f"patching {name}", fn, module))

        when_imported("deepspeed.runtime.engine", lib(_patch_deepspeed.patch_engine, self))
        if self.auto_roots:
            when_imported("torch.nn.parallel.distributed", lib(_patch_torch.patch_ddp_init, self))
            when_imported("torch._dynamo.eval_frame", lib(_patch_torch.patch_compiled, self))
            when_imported("torch.distributed.fsdp", lib(_patch_torch.patch_fully_shard, self))
        when_imported("deepspeed.comm.comm", lambda _m: self.counter.install_deepspeed())
        when_imported("accelerate.accelerator", lib(_patch_accelerate.patch_accelerator, self))
        when_imported("accelerate.scheduler", lib(_patch_accelerate.patch_scheduler, self))
        when_imported("transformers.training_args", lib(_patch_trainers.patch_hf_args, self))
        for name in ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"):
            when_imported(name, lib(_patch_trainers.patch_lightning, self))

    def _active(self) -> bool:
        return self.installed and not self._in_observer

    # -- backward ----------------------------------------------------------------------------
    def _run_backward(self, source: str, loss: Any, engine: Any, fn: Callable[..., Any],
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One backward pass: ``fn(*args, **kwargs)`` between the before/after bookkeeping.
        The hot path of every micro-step: plain attribute work and one event object."""
        if self._bw_depth or not self.installed or self._in_observer:
            return fn(*args, **kwargs)
        w = self._w
        if not self._armed and not self._wants_backwards:
            return self._run_unobserved_backward(source, w, fn, args, kwargs)
        ev = BackwardEvent(step=self.step, micro=len(w.backwards), source=source,
                           engine=self.engine, forwards=w.forwards)
        if self.attribute and self._given_roots:
            ev.reached = self._attribution.reaches(loss)
        w.forwards = 0
        if w.loss_ok:
            if not self.window_loss or not self._handlers["on_step"]:
                # Only the step record reads the window loss (no listener takes it: the
                # guard): keep no loss tensors; a listener added later sees it unknown.
                w.loss_ok = False
            elif isinstance(loss, torch.Tensor) and loss.numel() == 1:
                w.losses.append(loss.detach())
            else:
                w.loss_ok = False
        ev.sync_forward = self._last_sync_forward
        self._last_sync_forward = None
        root = self._sync_root
        if root is not None:  # the DDP/FSDP2 root whose forward fed this backward
            ev.sync_backward = self._sync_flag(root)
        else:
            for root in self._sync_roots:  # DDP/FSDP2 roots only (no forward seen yet)
                flag = self._sync_flag(root)
                if flag is not None:
                    ev.sync_backward = flag
                    break
        if engine is None and self._ds_engine is not None and source == "accelerate":
            engine = self._ds_engine
        if engine is not None:
            if id(engine) not in self.roots:
                self._add_root(engine)
            with contextlib.suppress(Exception):
                ev.ds_boundary = bool(engine.is_gradient_accumulation_boundary())
                ev.ds_coalescing = bool(getattr(engine, "inside_no_sync_ctxt", False))
        # an unchecked window stays unchecked: skip the call on the hot path
        track = False if self._window_checked is False else self._tracking()
        if track:
            t0 = time.perf_counter()
            # Unchanged grads since the previous backward's end (same tensors, same in-place
            # version): reuse that checksum instead of recomputing it.
            versions = grad_versions(self._tracked)
            if w.ends and versions == self._end_versions:
                w.starts.append(w.ends[-1])
            elif not w.ends and all(v is None for v in versions):
                w.starts.append(torch.zeros((len(self._tracked), 3), dtype=torch.float64))
            else:
                w.starts.append(self._checksums())
            self._t_checks += time.perf_counter() - t0
        handlers = self._handlers
        for listen in handlers["on_backward_start"]:
            listen(ev)
        lane = self.lanes.before_backward(self.backward_total)
        n_ends = len(w.ends)
        self._bw_depth += 1
        self._bw_current = ev
        try:
            return fn(*args, **kwargs)
        finally:
            self._bw_depth -= 1
            self._bw_current = None
            if track and len(w.starts) > len(w.ends):
                t0 = time.perf_counter()
                w.ends.append(self._checksums())
                self._end_versions = grad_versions(self._tracked)
                self._t_checks += time.perf_counter() - t0
            if lane is not None:
                checked = track and len(w.starts) == len(w.ends) == n_ends + 1
                self.lanes.after_backward(
                    lane, self.backward_total, ev, w.starts[-1] if checked else None,
                    w.ends[-1] if checked else None,
                    w.losses[-1] if w.loss_ok and w.losses else None)
            w.backwards.append(ev)
            self.losses.end_backward()
            w.bw_since_engine_step += 1
            w.zero_since_backward = 0
            self.backward_total += 1
            if self.boundary is not None:
                self.boundary.after_backward()
            for listen in handlers["on_backward"]:
                listen(ev)

    def _run_unobserved_backward(self, source: str, w: Window, fn: Callable[..., Any],
                                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A backward in an unarmed window (``sampled_records``): counted, no sync flag,
        engine query or checksum (the window's record, when :meth:`.Window.unusual` asks for it,
        leaves those unknown)."""
        ev = BackwardEvent(step=self.step, micro=len(w.backwards), source=source,
                           engine=self.engine, forwards=w.forwards)
        w.forwards = 0
        self._last_sync_forward = None
        lane = self.lanes.before_backward(self.backward_total)
        self._bw_depth += 1
        self._bw_current = ev  # collectives inside it are its own, not "between"
        try:
            return fn(*args, **kwargs)
        finally:
            self._bw_depth -= 1
            self._bw_current = None
            if lane is not None:
                self.lanes.after_backward(lane, self.backward_total, ev, None, None, None)
            w.backwards.append(ev)
            self.losses.end_backward()
            w.bw_since_engine_step += 1
            w.zero_since_backward = 0
            self.backward_total += 1

    # -- collectives -------------------------------------------------------------------------
    def _collective_position(self) -> tuple[int, int, bool]:
        """(optimizer step, backward passes so far in the window, inside a backward): where
        a collective was entered, for the report of a rank that never left it."""
        return self.step, len(self._w.backwards), self._bw_current is not None

    def _on_collective(self, op: str, reduces: bool) -> None:
        if not self._in_observer and self._handlers["on_collective"]:
            self._emit("on_collective", CollectiveEvent(self.step, op, reduces,
                                                        bool(self._ds_step_depth)))
        if not reduces or self._in_observer:
            return
        if self._bw_current is not None:
            self._bw_current.reductions += 1
        elif not (self._opt_depth or self._ds_step_depth):
            self._w.reductions_between += 1

    # -- optimizer steps ---------------------------------------------------------------------
    @hook_method
    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._opt_depth += 1
        if not self.installed or self._in_observer:
            return
        self._inner_stepped = True
        if self._handlers["on_optimizer_call"]:
            self._emit("on_optimizer_call", OptimizerCallEvent(
                self.step, self._opt_depth, bool(self._ds_step_depth), opt))
        if self._opt_depth > 1 or self._ds_step_depth:
            return
        self.lanes.register(opt, self.backward_total - len(self._w.backwards))
        applied = False  # a step with every gradient None is a no-op for torch optimizers
        for group in opt.param_groups:
            for prm in group["params"]:
                if prm.grad is not None:
                    applied = True
                    break
            if applied:
                break
        # a closure (Lightning's automatic optimisation, LBFGS) runs forward and backward
        # inside step(), after this hook: with no gradient yet, decide again after the step
        # (the global pre-hook gets step's own arguments: (optimizer, closure?), kwargs)
        rest = args[1:] if args and args[0] is opt else args
        closure = kwargs.get("closure", rest[0] if rest else None) if not applied else None
        self._step_closure = callable(closure)
        if self.engine == "local" and type(opt).__name__ == "ZeroRedundancyOptimizer":
            self.engine = "zero1"
        try:
            self._begin_step(opt, applied)
        except BaseException:
            self._opt_depth -= 1  # a listener stopped the step: torch runs no post hook
            raise

    @hook_method
    def _opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if not self.installed or self._in_observer:
            return
        self._opt_steps.add(opt)
        if self._opt_depth or self._ds_step_depth:
            return
        if self._step_closure and not self._step_applied:
            self._step_applied = any(p.grad is not None for g in opt.param_groups
                                     for p in g["params"])
        self._step_closure = False
        self._end_step("torch", type(opt).__name__, self._step_applied, None, opt)

    def _skipped_step(self, opt: Any) -> None:
        """A GradScaler step that found inf/NaN gradients and skipped the optimizer: the
        window ends without an update and its gradients are dropped (as a DeepSpeed overflow
        skip). It counts as an attempted step of ``opt`` for the scheduler rule (F4): the
        scheduler that steps after it is on time."""
        self._opt_steps.add(opt)
        if self._handlers["on_scaler_skip"]:
            self._emit("on_scaler_skip", ScalerEvent(self.step, len(self._w.backwards), "skip",
                                                     opt))
        self._step_t0 = time.perf_counter()
        self._step_cons = None
        self._ow = None
        self._end_step("torch", type(opt).__name__, False, None, opt, discarded=True)

    def _begin_step(self, opt: Any, applied: bool, engine: Any = None) -> None:
        self._step_t0 = time.perf_counter()
        self._step_applied = applied
        shared = self._w
        # several optimizers on disjoint parameters: this one's own window (:mod:`._lanes`)
        self._ow = ow = (self.lanes.window(opt, shared, self.backward_total, len(self._tracked))
                         if engine is None and self.lanes.several() else None)
        w = shared if ow is None else ow
        self._step_checksum = None
        self._step_members = None
        self._step_master = None
        if self._tracking() and w.starts and len(w.starts) == len(w.ends):
            t0 = time.perf_counter()
            # a collective writes .grad in place without bumping its version (c10d): after
            # one since the last backward the checksum is taken again
            same = (ow is None and not w.reductions_between
                    and grad_versions(self._tracked) == self._end_versions)
            self._step_checksum = w.ends[-1] if same else self._checksums()
            members = {id(p) for g in getattr(opt, "param_groups", []) for p in g["params"]}
            self._step_members = [id(p) in members for p in self._tracked]
            if engine is None and not all(self._step_members):
                # bf16 model .grad summed in place, fp32 copies stepped (master weights)
                with self._quiet():
                    self._step_master = model_grad_sum(
                        self._tracked, self._step_members, w.starts, w.ends,
                        [p for g in opt.param_groups for p in g["params"]])
            # a root's parameter replaced (an embedding resized) or unfrozen since the root
            # was first seen: tracked from the next window (not an optimizer's own copies:
            # fp32 master weights get their .grad at the step, not from the backwards)
            live: set[int] = set()
            for root in list(self.roots.values()):
                live |= self._track(root)
            # a parameter replaced inside its root and stepped by this optimizer no more is
            # not kept alive by the observer (a resized embedding's old weight would stay in
            # memory): its row stays (rows are positional), with no gradient
            for i, p in enumerate(self._tracked):
                if id(p) not in live and id(p) not in members and p is not _GONE:
                    self._tracked_ids.discard(id(p))
                    self._tracked_names.pop(id(p), None)
                    self._tracked[i] = _GONE
            self._t_checks += time.perf_counter() - t0
        self._step_cons = self._verdict()
        if self.record_updates:
            self._before = self._snapshot(opt, engine)
        # the same optimizer (engine) stepping again with no backward pass since its
        # previous step: whether it moves the parameters decides the finding (rare: its
        # cost is paid by such steps only). Another optimizer's step right after (an
        # actor and a critic stepping one after the other) is not judged here.
        # A torch optimizer's gradients may come from elsewhere than a backward the observer
        # sees (torch.autograd.grad assigned by hand): judged only when no new gradient
        # arrived, measured (the same .grad tensors, unwritten since that step, or zeros).
        self._idle_before = None
        owner = id(opt if engine is None else engine)
        if (not w.backwards and applied and owner == self._last_owner
                and (engine is not None or self._no_new_grad(opt))):
            self._idle_before = (self._before if self._before is not None
                                 else self._snapshot(opt, engine))
        self._last_owner = owner
        if not self._handlers["on_step_start"]:
            return
        self._emit("on_step_start", StepStartEvent(
            step=self.step, backwards=len(w.backwards),
            source="torch" if engine is None else "deepspeed", applied=applied,
            engine=self.engine, conservation=self._step_cons,
            owner=opt if engine is None else engine))

    def _verdict(self) -> Any:
        """Conservation verdict on what the step about to run receives (None: unchecked)."""
        w = self._w if self._ow is None else self._ow
        if self._step_checksum is None or self._step_members is None:
            return None
        t0 = time.perf_counter()
        cons = None
        # The tracked parameters only grow (a module first called, or a parameter replaced,
        # mid-window appends rows): the window is judged on the rows every checksum of it
        # has, the parameters tracked since its first backward. One added later is judged
        # from its first full window on (its earlier micro-steps were not measured).
        n = min((int(c.shape[0]) for c in (*w.starts, *w.ends)),
                default=len(self._step_members))
        mask = torch.tensor(self._step_members[:n], dtype=torch.bool)
        if bool(mask.any()) and len(w.starts) == len(w.backwards):
            dtype = next((p.dtype for p, m in zip(self._tracked, self._step_members[:n],
                                                  strict=False) if m), torch.float32)
            cons = conservation(starts=[s[:n][mask] for s in w.starts],
                                ends=[e[:n][mask] for e in w.ends],
                                received=self._step_checksum[:n][mask], tol=tol_for(dtype))
        self._t_checks += time.perf_counter() - t0
        return cons

    @staticmethod
    def _grad_state(opt: Any) -> list[tuple[int, int]]:
        return [(id(p.grad), p.grad._version) for g in getattr(opt, "param_groups", [])
                for p in g["params"] if p.grad is not None]

    def _no_new_grad(self, opt: Any) -> bool:
        """No gradient reached ``opt`` since its previous step: its ``.grad`` tensors are
        those it stepped on, unwritten since, or every one is zero."""
        if self._grad_state(opt) == self._last_grads:
            return True
        with self._quiet():
            return all(not bool(local(p.grad).any()) for g in opt.param_groups
                       for p in g["params"] if p.grad is not None)

    def _end_step(self, source: str, opt_name: str, applied: bool, norm: float | None,
                  owner: Any, *, discarded: bool = False) -> None:
        w = self._w
        own, self._ow = self._ow, None
        if source == "torch":
            self.lanes.stepped(owner, self.backward_total)
            self._last_grads = self._grad_state(owner)
        updates = None
        before: dict[str, torch.Tensor] | None
        if self.record_updates and self._before is not None and applied:
            after = self._snapshot(owner if source == "torch" else None,
                                   owner if source == "deepspeed" else None)
            before = self._before
            if len(after) == len(before) and list(after) != list(before):
                # the same parameters in the same order, named after the step: a closure's
                # backward (Lightning) made the first names known inside this step
                updates = {k: a - b for (k, a), b in zip(after.items(), before.values(),
                                                         strict=True) if a.shape == b.shape}
            else:
                updates = {k: (after[k] - v) for k, v in before.items() if k in after}
        before, self._before = self._before, None
        moved = None
        if self._idle_before is not None:
            after = self._snapshot(owner if source == "torch" else None,
                                   owner if source == "deepspeed" else None)
            moved = any(k in after and not torch.equal(after[k], v)
                        for k, v in self._idle_before.items())
            self._idle_before = None
        cons = self._step_cons
        self._step_cons = None
        if self.sampled_records:
            if w.zero_between and cons is None and self._trackable():
                # gradients zeroed inside a window no checksum saw (an epoch's reset, a
                # leftover): verify the next windows, sampled or not
                self.force_checks = FORCED_CHECKS
            armed = self._armed
            # a sampled window a GradScaler skipped hands its sample to the next window (fp16
            # runs skip their first steps: step 0 would otherwise be checked never)
            self._armed = (sampled(self.step + 1, self.every) or self.force_checks > 0
                           or (discarded and armed))
            if self._armed != armed:
                self._hook_roots(self._armed)
            if not armed and not w.unusual(self.window_size):
                self._next_window()
                return
        if not self._handlers["on_step"]:
            # No listener takes the step record (the guard): skip building it (the window
            # loss reduction, its host copy and a dozen per-window lists).
            self._next_window()
            return
        chk = None
        if cons is not None and self._step_members is not None \
                and self._step_checksum is not None:
            mask = torch.tensor(self._step_members, dtype=torch.bool)
            chk = [float(x) for x in self._step_checksum[mask].sum(0)]
        ev = (w if own is None else own).record(
            step=self.step, applied=applied, source=source, optimizer=opt_name,
            engine=self.engine, grad_norm=norm, conservation=cons, checksum=chk,
            wall=time.perf_counter() - self._step_t0, param_dtype=self._dtype_of(owner),
            updates=updates, precision=self._precision(owner, source, w),
            param_norm=(None if updates is None or before is None else
                        float(sum(float(v.pow(2).sum()) for v in before.values())) ** 0.5),
            # a torch step with every gradient None changes nothing: its window goes on;
            # a DeepSpeed step that skipped its update (overflow) discarded its window
            losses=self.losses.take(applied, carry=source == "torch" and not discarded),
            discarded=discarded, moved=moved)
        if ev.losses:  # the ledger composes the loss weights with the engine's reduction
            ev.rank_factor = rank_factor(self.engine, self._sync_roots, self._fsdp_groups,
                                         self._ds_engine)
        if own is not None:
            # the loss record follows the shared window's backwards, not this optimizer's
            ev.losses = None
            ev.optimizer_index = self.lanes.key(owner)
        self._next_window(reset_losses=False)  # losses.take() above reset them
        if self._global_handle is not None and self.step >= PIN_ROOTS_AFTER_STEPS:
            self._pin_roots()
        self._emit("on_step", ev)

    def _next_window(self, *, reset_losses: bool = True) -> None:
        self.step += 1
        self._w = Window()
        self._window_checked = None if self._armed else False  # unarmed: no checksums
        if self.boundary is not None:
            self.boundary.reset()
        if reset_losses:
            self.losses.reset()

    def boundary_scale(self) -> float | None:
        """The one scale the loop applied to the accumulated gradient after this window's
        last backward, clips excluded (:mod:`._boundary`); None: unmeasured (an unchecked
        window, DeepSpeed, whose gradients are not in ``.grad``); nan: not one scale.
        Valid until the observer ends the window (an optimizer's own post hooks run first)."""
        if self.boundary is None or self.engine == "deepspeed":
            return None
        with self._quiet():
            return self.boundary.scale()

    def _count_sched(self, sched: Any) -> None:
        count = self._sched_counts.add(sched)
        opt = getattr(sched, "optimizer", None)
        opt_steps = self._opt_steps.get(opt, self.step) if opt is not None else self.step
        in_step = bool(self._opt_depth or self._ds_step_depth)
        self._w.sched += 0 if in_step else 1
        if self._handlers["on_scheduler_step"]:
            self._emit("on_scheduler_step", SchedulerEvent(
                self.step, len(self._w.backwards), count, opt_steps, in_step, sched))

    # -- helpers ----------------------------------------------------------------------------
    def _emit(self, method: str, event: Any) -> None:
        for fn in self._handlers[method]:
            fn(event)

    @contextlib.contextmanager
    def _quiet(self) -> Any:
        self._in_observer += 1
        try:
            with self.counter.paused():
                yield
        finally:
            self._in_observer -= 1

    def _trackable(self) -> bool:
        if not self.check_conservation or not self._tracked:
            return False
        # ZeRO >= 1 keeps gradients in engine buffers, not in .grad
        return self.engine_info is None or (self.engine_info.zero_stage or 0) < 1

    def _tracking(self) -> bool:
        if not self._trackable():
            return False
        if self._window_checked is None:  # decided once per window, at its first event
            if self.force_checks > 0:
                self.force_checks -= 1
                self._window_checked = True
                return True
            # sampled_records: the arming at the previous step end already decided it
            ok = self._armed if self.sampled_records else self.step % self.every == 0
            if ok and self.budget is not None and self.step >= 2:
                elapsed = time.perf_counter() - self._t_start
                ok = self._t_checks <= self.budget * elapsed
            self._window_checked = ok
        return self._window_checked

    def _dtype_of(self, owner: Any) -> str | None:
        """:func:`_param_dtype`, once per optimizer/engine (it walks every parameter; a
        model does not change dtype between steps)."""
        key = id(owner)
        if key not in self._dtypes:
            self._dtypes[key] = param_dtype(owner)
        return self._dtypes[key]

    def _precision(self, owner: Any, source: str, w: Window) -> dict[str, Any] | None:
        """The step record's ``precision`` (:func:`._precision.step_facts`); the per-owner
        part is read once (again when a parameter is tracked or FSDP2 was not set up yet)."""
        key = (id(owner), len(self._tracked))
        static = self._prec_static.get(key)
        if static is None:
            groups = [g for gs in self._fsdp_groups.values() for g in gs]
            fsdp = fsdp_dtypes(groups) if groups else None
            static = (least_precise(name_of(p.dtype) for p in self._tracked if p is not _GONE),
                      fsdp, deepspeed_dtypes(owner) if source == "deepspeed" else None)
            if fsdp is not None or not groups:
                self._prec_static = {key: static}
        return step_facts(params=static[0], fsdp=static[1], deepspeed=static[2],
                          autocast=w.autocast, model_grad=self._step_master)

    def _checksums(self) -> torch.Tensor:
        with self._quiet():
            return checksums(self._tracked)

    def _snapshot(self, opt: Any, engine: Any) -> dict[str, torch.Tensor]:
        with self._quiet():
            return snapshot(opt, engine, self._tracked_names)
