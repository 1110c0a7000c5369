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
``_count_sched``, the ``_handlers`` of each event kind): the event dispatch, the lifecycle and the optimizer hooks are
here; the per-micro-step work is the :mod:`._backward` mixin, the per-step work and the
arming of sampled windows the :mod:`._steps` mixin (the step record's precision facts:
:mod:`._step_precision`), the forward side the :mod:`._forwards` mixin. Which backward
reaches a root is :mod:`._attribution`; a window and the step record it becomes,
:mod:`._window`.

Events go to listeners (the guard, ``watch``'s recorder). A listener may raise from
``on_step_start``/``on_backward_start``/``on_zero_grad``/``on_scheduler_step``/
``on_clip`` to stop the action before it happens (the guard does).
"""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from types import ModuleType

import torch
from torch.utils.hooks import RemovableHandle

from accumguard.engines.dcp import is_state_init_step
from accumguard.observe import _patch_accelerate, _patch_deepspeed, _patch_torch, _patch_trainers
from accumguard.observe._attribution import Attribution
from accumguard.observe._backward import BackwardPath
from accumguard.observe._boundary import BoundaryScale
from accumguard.observe._checksum import Conservation
from accumguard.observe._collectives import CollectiveCounter
from accumguard.observe._events import (
    BackwardEvent,
    CollectiveEvent,
    EngineInfo,
    Handlers,
    OptimizerCallEvent,
    SchedulerEvent,
)
from accumguard.observe._failsafe import Failsafe, Failure, hook_method
from accumguard.observe._forwards import ForwardHooks
from accumguard.observe._imports import when_imported as _when_imported
from accumguard.observe._lanes import Lanes
from accumguard.observe._losses import LossRecorder
from accumguard.observe._lr_trace import LrTrace
from accumguard.observe._patch import Patches
from accumguard.observe._precision import AccumDrift, MasterSum
from accumguard.observe._profiles import ObserverProfile
from accumguard.observe._step_precision import StepPrecision
from accumguard.observe._steps import PIN_ROOTS_AFTER_STEPS, StepMachinery
from accumguard.observe._tail import Tail
from accumguard.observe._tally import Tally
from accumguard.observe._window import StepTally

#: With several optimizers, the first two windows of each are checked whatever the time
#: budget (as the run's first two are), up to this many shared windows (an optimizer that
#: never steps does not lift the budget for ever).
LANE_FIRST_LIMIT = 64

# PIN_ROOTS_AFTER_STEPS lives in :mod:`._steps`; re-exported here (its old home)
__all__ = ["PIN_ROOTS_AFTER_STEPS", "Observer"]


class Observer(ForwardHooks, BackwardPath, StepMachinery, StepPrecision):
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
        observe_steps: end observation after this many optimizer steps (``watch``: a long
            run's steady state costs nothing once its first windows were seen), later while
            the first DataLoader pass whose end is in reach has not ended
            (:meth:`~._steps.StepMachinery._retire_due`); None: observe to the end.
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
                 failsafe: Failsafe | None = None,
                 observe_steps: int | None = None) -> None:
        self.listeners: list[object] = []
        # the listeners' bound methods per event kind (:class:`._events.Handlers`)
        self._handlers = Handlers()
        self._wants_backwards = False
        self._dtypes: dict[int, str | None] = {}
        self.roots: dict[int, torch.nn.Module] = {}
        self._sync_roots: list[torch.nn.Module] = []  # roots with a gradient-sync flag (DDP, FSDP2)
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
        self.observe_steps = observe_steps
        self._pass_at: list[int] = []  # windows in which a DataLoader pass began
        self._pass_len: int | None = None  # micro-batches of the first pass (len(loader))
        self._pass_bw0: int | None = None  # backward count at the current pass's start
        self.tail: Tail | None = None  # the counters after observation ended (_tail)
        self.boundary = BoundaryScale(boundary_param) if boundary_param is not None else None
        self._armed = True  # this window is sampled (always, without sampled_records)
        self._root_handles: list[RemovableHandle] = []
        self.force_checks = 0  # check conservation on the next N windows whatever the budget
        self._attribution = Attribution(self._reach)  # which backwards reach a root
        self._step_cons: Conservation | None = None
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
        self.drift = AccumDrift(self.failsafe.hook)  # a low-precision sum's rounding (F12)
        self.counter.position = self._collective_position
        self.installed = False
        self.backward_total = 0
        self.engine = "local"
        self.engine_info: EngineInfo | None = None
        self.declared_k: dict[str, int] = {}
        self.k_changes: list[list[int]] = []
        self.k_changes_by = ""  # who set them (the words of the findings)
        self.accelerate_k_from = -1  # backwards before Accelerate's K > 1 was first seen
        self.state_loads: list[int] = []  # optimizer steps at which an optimizer's state was loaded
        # the training frameworks seen driving the run (a Trainer built, Accelerate's
        # backward called): the fixes are worded in their idiom (taxonomy.fix_in)
        self.frameworks: list[str] = []
        # Accelerate accumulating (K > 1, windows closed at a pass's end): its backwards
        # inside a DataLoader it prepared, and outside any (it cannot see where a pass ends)
        self.accelerate_loader = [0, 0]
        self.trainer_clip: float | None = None  # the HF Trainer's max_grad_norm (patched in)
        self._w = StepTally()
        # several optimizers over disjoint parameters: each one's own window (:mod:`._lanes`)
        self.lanes = Lanes()
        self.lr_trace = LrTrace()  # learning rates read at each backward (F4, by hand)
        self._ow: StepTally | None = None  # the stepping optimizer's own window, if not self._w
        self._unborn = 0  # backwards _ow left out: before its optimizer was made (a resume)
        self._fwd_depth = 0
        # modules called at the top level -> their depth-counting post hook (weak: a loss
        # module built on every step takes its hook with it when it is freed)
        self._depth_hooked: weakref.WeakKeyDictionary[torch.nn.Module, RemovableHandle] = \
            weakref.WeakKeyDictionary()
        self._hooked_ids: set[int] = set()  # fast negative test for the map above
        self._global_handle: RemovableHandle | None = None  # auto_roots: the global pre-hook until pinned
        self._pinned: list[RemovableHandle] = []  # auto_roots: per-root pre-hooks after pinning
        self._pinned_any = False  # _pin_roots ran (a DDP built later is hooked on its own)
        self._bw_depth = 0
        self._bw_current: BackwardEvent | None = None
        self._opt_depth = 0
        self._init_step = False  # the step at hand is DCP's state initialisation (engines.dcp)
        self._ds_step_depth = 0
        self._inner_stepped = False
        self._sched_depth = 0
        self._in_data_pass = 0
        self._accel_sched_inner = 0
        self._zero_depth = 0
        self._in_observer = 0
        self._last_sync_forward: bool | None = None
        self._sync_root: torch.nn.Module | None = None  # the last DDP/FSDP2 root whose forward ran
        self._tracked: list[torch.Tensor] = []
        self._end_versions: list[tuple[int, int] | None] = []
        # collectives the script issued outside a backward, and their count when the last
        # backward's end checksum was taken: c10d writes .grad in place without bumping its
        # version, so an equal version after a collective is no witness
        self._collectives_seen = 0
        self._end_collectives = -1
        self._tracked_names: dict[int, str] = {}
        self._tracked_ids: set[int] = set()
        self._fsdp_groups: dict[int, list[object]] = {}
        self._ds_engine: torch.nn.Module | None = None
        # each DeepSpeed engine's backwards since its last boundary step (several engines in
        # one process, an actor and a critic: each steps on its own window)
        self._engine_bws: dict[int, list[BackwardEvent]] = {}
        self._sched_counts = Tally()
        self._opt_steps = Tally()
        self._opt_serials = Tally()  # optimizer -> its number (StepMachinery._serial)
        self._n_serials = 0
        self._before: dict[str, torch.Tensor] | None = None
        self._idle_before: dict[str, torch.Tensor] | None = None  # see _begin_step
        self._last_owner = 0  # id() of the optimizer/engine of the previous step
        self._last_grads: list[tuple[int, int]] = []  # its gradients then: (id, version)
        self._step_checksum: torch.Tensor | None = None
        self._step_bw0 = 0  # backward passes ended when the step at hand began
        self._step_members: list[bool] | None = None
        self._step_master: MasterSum | None = None  # see _precision.model_grad_sum
        # per (optimizer, DDP roots, trainable count): its parameters no DDP root holds
        # (StepMachinery._unwrapped)
        self._unwrapped_of: dict[tuple[int, int, int], list[str]] = {}
        self._loose_of: dict[tuple[int, int, int], list[torch.Tensor]] = {}  # ... those parameters
        self._loose_key: dict[int, tuple[int, int, int]] = {}  # per optimizer: its last key
        # per DDP wrapper built under observation: the parameters frozen when it was built
        self.ddp_frozen: MutableMapping[object, frozenset[int]] = weakref.WeakKeyDictionary()
        self._prec_static: dict[tuple[int, int],
                                tuple[str | None, dict[str, str] | None,
                                      dict[str, str] | None]] = {}
        self._step_applied = True
        self._step_closure = False  # the step at hand got a closure and no gradient before it
        self._step_t0 = 0.0

    # -- lifecycle ------------------------------------------------------------------------
    def add_listener(self, listener: object, *, sampled_only: bool = False) -> None:
        """Add a listener: any object with some of the :class:`._events.Handlers` methods
        (``on_step``, ``on_backward``...), each looked up once here. ``sampled_only``: its
        backward methods need only the windows ``sampled_records`` observes fully (the
        callbacks' collective ledger judges checked steps only), so they do not make every
        other window's backwards observed too."""
        self.listeners.append(listener)
        self._handlers = Handlers.of(self.listeners)
        if not sampled_only:
            every = Handlers.of([listener])
            self._wants_backwards = self._wants_backwards or bool(
                every.on_backward or every.on_backward_start)

    @property
    def failure(self) -> Failure | None:
        """accumguard's own failure on this process (observation off since), or None."""
        return self.failsafe.failure

    @classmethod
    def from_profile(cls, profile: ObserverProfile,
                     roots: Iterable[torch.nn.Module] | None = None, *,
                     failsafe: Failsafe | None = None,
                     boundary_param: torch.Tensor | None = None) -> Observer:
        """An observer configured for one product (:mod:`._profiles`: ``watch``, ``guard``,
        ``callbacks``, ``rescale``) rather than by combining the constructor's flags."""
        return cls(roots, auto_roots=profile.auto_roots, conservation=profile.conservation,
                   record_updates=profile.record_updates, every=profile.every,
                   budget=profile.budget, attribute=profile.attribute,
                   record_losses=profile.record_losses, window_loss=profile.window_loss,
                   sampled_records=profile.sampled_records, window_size=profile.window_size,
                   boundary_param=boundary_param, failsafe=failsafe,
                   observe_steps=profile.observe_steps)

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
        if self.tail is not None:
            self.tail.remove()
        self.patches.undo()
        for handle in list(self._depth_hooked.values()):
            handle.remove()
        self._depth_hooked.clear()
        self._hooked_ids.clear()
        self._fwd_depth = 0
        self._attribution.reset()
        self.drift.remove()
        self._sync_root, self._pinned_any = None, False  # no reference to the user's model

    def _start_tail(self) -> None:
        """Observation ended (``observe_steps``) and its patches are gone: count the rest."""
        if self.tail is None and not self.installed:
            tail = Tail([opt for opt, _ in self._opt_steps.items()])
            try:
                self.tail = tail.install()
            except Exception:  # noqa: BLE001 - the run goes on; its rest stays unknown
                tail.remove()

    def tail_record(self, reason: str) -> dict[str, object]:
        """The ``tail`` record at the run's end: what the run did after observation ended
        (:mod:`._tail`), or ``unknown`` when nothing counted it (the run ended before
        another patched call, or the counters could not be installed): the rules then
        judge the observed steps as a run cut there."""
        if self.tail is None:
            return {"kind": "tail", "reason": reason, "unknown": True}
        observed = {id(o): n for o, n in self._opt_steps.items()}
        out = self.tail.record(lambda opt: observed.get(opt, 0), self.step)
        out["reason"] = reason
        return out

    def __enter__(self) -> Observer:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _failed(self, failure: Failure) -> None:
        """The failsafe tripped: tell the listeners (their own errors are ignored there)."""
        for fn in self._handlers.on_internal_error:
            fn(failure)

    def _hook_libraries(self) -> None:
        """Patch DeepSpeed, Accelerate, HF and Lightning when (if) they are imported."""
        fs = self.failsafe

        lib = functools.partial

        def when_imported(name: str, fn: Callable[[ModuleType], None]) -> None:
            _when_imported(name, lambda module: fs.guard(f"patching {name}", fn, module))

        when_imported("deepspeed.runtime.engine", lib(_patch_deepspeed.patch_engine, self))
        when_imported("deepspeed.runtime.zero.stage_1_and_2",
                      lib(_patch_deepspeed.patch_zero_optimizer, self))
        if self.auto_roots:
            when_imported("torch.nn.parallel.distributed", lib(_patch_torch.patch_ddp_init, self))
            when_imported("torch._dynamo.eval_frame", lib(_patch_torch.patch_compiled, self))
            when_imported("torch.distributed.fsdp", lib(_patch_torch.patch_fully_shard, self))
        when_imported("deepspeed.runtime.lr_schedules", lib(_patch_deepspeed.patch_schedules, self))
        when_imported("deepspeed.comm.comm", lambda _m: self.counter.install_deepspeed())
        when_imported("accelerate.accelerator", lib(_patch_accelerate.patch_accelerator, self))
        when_imported("accelerate.scheduler", lib(_patch_accelerate.patch_scheduler, self))
        when_imported("transformers.training_args", lib(_patch_trainers.patch_hf_args, self))
        for name in ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"):
            when_imported(name, lib(_patch_trainers.patch_lightning, self))
        for pkg in ("lightning.pytorch", "pytorch_lightning"):
            when_imported(f"{pkg}.callbacks.gradient_accumulation_scheduler",
                          lib(_patch_trainers.patch_lightning_k_schedule, self))

    def _active(self) -> bool:
        return self.installed and not self._in_observer

    # -- collectives -------------------------------------------------------------------------
    def _collective_position(self) -> tuple[int, int, bool]:
        """(optimizer step, backward passes so far in the window, inside a backward): where
        a collective was entered, for the report of a rank that never left it."""
        return self.step, len(self._w.backwards), self._bw_current is not None

    def _on_collective(self, op: str, reduces: bool) -> None:
        if self._bw_current is None and not self._in_observer:
            self._collectives_seen += 1
        fns = self._handlers.on_collective
        if not self._in_observer and fns:
            ev = CollectiveEvent(self.step, op, reduces, bool(self._ds_step_depth))
            for fn in fns:
                fn(ev)
        if not reduces or self._in_observer:
            return
        if self._bw_current is not None:
            self._bw_current.reductions += 1
        elif not (self._opt_depth or self._ds_step_depth):
            self._w.reductions_between += 1

    # -- optimizer steps ---------------------------------------------------------------------
    @hook_method
    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple[object, ...],
                 kwargs: dict[str, object]) -> None:
        self._opt_depth += 1
        if not self.installed or self._in_observer:
            return
        self._inner_stepped = True
        fns = self._handlers.on_optimizer_call
        if fns:
            ev = OptimizerCallEvent(self.step, self._opt_depth, bool(self._ds_step_depth), opt)
            for fn in fns:
                fn(ev)
        if self._opt_depth > 1 or self._ds_step_depth:
            return
        if self.lr_trace.closures:
            self.lr_trace.at_step_start()
        if not opt.state and is_state_init_step(opt):
            # DCP giving a new optimizer its state (a zero-rate step on zeros): no window
            # of its; the backwards left open before it (an abandoned run's) are dropped
            self._init_step = True
            self._state_init_step(opt)
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
    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple[object, ...],
                  kwargs: dict[str, object]) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if not self.installed or self._in_observer:
            return
        if self._init_step and not self._opt_depth:
            self._init_step = False
            return
        self._opt_steps.add(opt)
        if self._opt_depth or self._ds_step_depth:
            return
        if self._step_closure and not self._step_applied:
            self._step_applied = any(p.grad is not None for g in opt.param_groups
                                     for p in g["params"])
        self._step_closure = False
        self._end_step("torch", type(opt).__name__, self._step_applied, None, opt)

    def boundary_scale(self) -> float | None:
        """The one scale the loop applied to the accumulated gradient after this window's
        last backward, clips excluded (:mod:`._boundary`); None: unmeasured (an unchecked
        window, DeepSpeed, whose gradients are not in ``.grad``); nan: not one scale.
        Valid until the observer ends the window (an optimizer's own post hooks run first)."""
        if self.boundary is None or self.engine == "deepspeed":
            return None
        with self._quiet():
            return self.boundary.scale()

    def accelerate_block(self, counter: object) -> None:
        """An ``accelerator.backward`` with Accelerate's block counter (``Accelerator.step``,
        moved by each ``accumulate()`` block) at ``counter``: a new block of the window when
        it moved since the window's previous such backward."""
        if type(counter) is not int:
            return  # (an Accelerate without the counter: blocks unknown)
        w = self._w
        if counter != w.acc_last or not w.acc_blocks:
            w.acc_last = counter
            w.acc_blocks.append(1)
        else:
            w.acc_blocks[-1] += 1

    def _count_sched(self, sched: object, positioned: bool = False) -> None:
        if positioned:
            # ``step(epoch)``: the script sets the schedule's position (a fractional epoch
            # per micro-batch is legal), so the calls are not its steps
            self._w.sched_set += 1
            return
        count = self._sched_counts.add(sched)
        opt = getattr(sched, "optimizer", None)
        known = self._opt_steps.get(opt, -1) if opt is not None else -1
        opt_steps = known if known >= 0 else self.step
        in_step = bool(self._opt_depth or self._ds_step_depth)
        self._w.sched += 0 if in_step else 1
        fns = self._handlers.on_scheduler_step
        if fns:
            ev = SchedulerEvent(self.step, len(self._w.backwards), count, opt_steps, in_step,
                                sched, fresh=opt is not None and known < 0)
            for fn in fns:
                fn(ev)

    # -- helpers ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
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
            if ok and self.budget is not None and self.step >= 2 and not (
                    self.step < LANE_FIRST_LIMIT and self.lanes.young(2)):
                elapsed = time.perf_counter() - self._t_start
                ok = self._t_checks <= self.budget * elapsed
            self._window_checked = ok
        return self._window_checked
