"""The step machinery of the observer: a window's end at an optimizer (engine) step.

A mixin of :class:`~._observer.Observer` (the optimizer hooks and the patches of
DeepSpeed's ``engine.step`` and GradScaler call ``obs._begin_step``/``obs._end_step``/
``obs._skipped_step``). Before the step: the checksum of what the step receives and the
conservation verdict (:mod:`._checksum`), the parameter snapshot for ``record_updates``,
an idle re-step's snapshot, ``on_step_start``. After it: the updates, the arming of the next
sampled window, the step record (:meth:`._window.StepTally.record`) and ``on_step``.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace
from itertools import chain
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

import torch

from accumguard.observe._checksum import (
    FORCED_CHECKS,
    checksums,
    conservation,
    grad_versions,
    sampled,
)
from accumguard.observe._events import ScalerEvent, StepStartEvent
from accumguard.observe._introspect import local, snapshot, tol_for
from accumguard.observe._lanes import lane_scales
from accumguard.observe._loose import LooseParameters
from accumguard.observe._precision import AccumDrift, MasterSum, model_grad_sum
from accumguard.observe._reduction import fsdp2_mesh, rank_factor, unit_factors
from accumguard.observe._window import StepTally

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from accumguard.observe._boundary import BoundaryScale
    from accumguard.observe._checksum import Conservation
    from accumguard.observe._events import BackwardEvent, Handlers
    from accumguard.observe._failsafe import Failsafe
    from accumguard.observe._lanes import Lanes
    from accumguard.observe._losses import LossRecorder
    from accumguard.observe._lr_trace import LrTrace
    from accumguard.observe._tally import Tally

__all__ = ["OBSERVE_MAX", "PIN_ROOTS_AFTER_STEPS", "StepMachinery"]

_PARAMS = itemgetter("params")
_GRAD = attrgetter("grad")
_VERSION = attrgetter("_version")
_REQUIRES_GRAD = attrgetter("requires_grad")

#: The row of a tracked parameter that was replaced and dropped (no gradient, checksum 0).
_GONE = torch.empty(0)

#: ``observe_steps``: the most optimizer steps observed while waiting for the end of the first
#: DataLoader pass (an epoch tail is judged at its window); a first pass predicted to end
#: later ends observation at ``observe_steps`` already.
OBSERVE_MAX = 2048

#: ``auto_roots``: optimizer steps after which the modules seen at the top level are hooked
#: one by one instead of through the global forward pre-hook (:meth:`Observer._pin_roots`).
PIN_ROOTS_AFTER_STEPS = 2


class StepMachinery(LooseParameters):
    """``_begin_step``/``_end_step``/``_skipped_step`` and their helpers (state: the
    observer's ``_step_*``, ``_before``/``_idle_before``, ``_last_owner``/``_last_grads``,
    set up in ``Observer.__init__``)."""

    # (attributes of the observer this mixin uses; typed here for readers and checkers)
    roots: dict[int, torch.nn.Module]
    engine: str
    step: int
    every: int
    observe_steps: int | None
    _pass_at: list[int]
    _pass_len: int | None
    _pass_bw0: int | None
    failsafe: Failsafe
    record_updates: bool
    sampled_records: bool
    window_size: int | None
    force_checks: int
    backward_total: int
    boundary: BoundaryScale | None
    drift: AccumDrift
    lanes: Lanes
    losses: LossRecorder
    lr_trace: LrTrace
    _armed: bool
    _w: StepTally
    _ow: StepTally | None
    _engine_bws: dict[int, list[BackwardEvent]]
    _unborn: int
    _handlers: Handlers
    _sync_roots: list[torch.nn.Module]
    _ds_engine: torch.nn.Module | None  # DeepSpeed's engine (an nn.Module)
    _bw_current: BackwardEvent | None  # the backward pass running now, if any
    _tracked: list[torch.Tensor]
    _tracked_ids: set[int]
    _tracked_names: dict[int, str]
    _fsdp_groups: dict[int, list[object]]
    _end_versions: list[tuple[int, int] | None]
    _collectives_seen: int
    _end_collectives: int
    _window_checked: bool | None
    _t_checks: float
    _global_handle: RemovableHandle | None
    _opt_steps: Tally
    _opt_serials: Tally
    _n_serials: int
    _step_t0: float
    _step_applied: bool
    _step_cons: Conservation | None
    _step_checksum: torch.Tensor | None
    _step_bw0: int  # backward passes ended when the step at hand began
    _step_members: list[bool] | None
    _step_master: MasterSum | None
    _before: dict[str, torch.Tensor] | None
    _idle_before: dict[str, torch.Tensor] | None
    _last_owner: int
    _last_grads: list[tuple[int, int]]

    if TYPE_CHECKING:  # defined by the observer and its other mixins
        def _quiet(self) -> contextlib.AbstractContextManager[None]: ...
        def _trackable(self) -> bool: ...
        def _tracking(self) -> bool: ...
        def _track(self, root: torch.nn.Module) -> set[int]: ...
        def _hook_roots(self, on: bool) -> None: ...
        def _pin_roots(self) -> None: ...
        def _dtype_of(self, owner: object) -> str | None: ...
        def _precision(self, owner: object, source: str, w: StepTally) -> dict[str, Any] | None: ...
        def _start_tail(self) -> None: ...

    def _skipped_step(self, opt: torch.optim.Optimizer) -> None:
        """A GradScaler step that found inf/NaN gradients and skipped the optimizer: the
        window ends without an update and its gradients are dropped (as a DeepSpeed overflow
        skip). It counts as an attempted step of ``opt`` for the scheduler rule (F4): the
        scheduler that steps after it is on time."""
        self._opt_steps.add(opt)
        fns = self._handlers.on_scaler_skip
        if fns:
            ev = ScalerEvent(self.step, len(self._w.backwards), "skip", opt)
            for fn in fns:
                fn(ev)
        self._step_t0 = time.perf_counter()
        self._step_cons = None
        self._ow = None
        self._end_step("torch", type(opt).__name__, False, None, opt, discarded=True)

    def _engine_window(self, engine: torch.nn.Module) -> StepTally:
        """Several DeepSpeed engines backwarding in one process (DeepSpeed-Chat's actor and
        critic, each with its own gradient accumulation): the stepping engine's window is
        its own ``engine.backward`` calls since its previous boundary step, which the other
        engine's steps cut apart in the shared window. Its backwards' flags, counts and
        boundaries are kept; the window's checksums and loss record belong to the shared
        window, so conservation and the loss rules do not judge it."""
        own = StepTally()
        own.backwards = self._engine_bws.get(id(engine), [])
        self._engine_bws[id(engine)] = []
        own.loss_ok = False
        return own

    def _state_init_step(self, opt: torch.optim.Optimizer) -> None:
        """The step ``torch.distributed.checkpoint`` runs to give a new optimizer its state
        (:mod:`accumguard.engines.dcp`): it applies nothing, and the backward passes before
        it are not this optimizer's (a run rebuilt to resume: the abandoned model's). The
        window ends discarded, as a skipped step's; it is no step for the scheduler rule."""
        self._step_t0 = time.perf_counter()
        self._step_cons = None
        self._ow = None
        self._end_step("torch", type(opt).__name__, False, None, opt, discarded=True,
                       state_init=True)

    def _begin_step(self, opt: object, applied: bool,
                    engine: torch.nn.Module | None = None) -> None:
        self._step_t0 = time.perf_counter()
        self.lr_trace.know(opt if engine is None else getattr(engine, "optimizer", None))
        self._step_applied = applied
        shared = self._w
        # several optimizers on disjoint parameters: this one's own window (:mod:`._lanes`)
        self._ow = ow = (self.lanes.window(opt, shared, self.backward_total, len(self._tracked))
                         if engine is None and self.lanes.several() else None)
        if engine is not None and len(self._engine_bws) > 1 and -1 not in self._engine_bws:
            self._ow = ow = self._engine_window(engine)
        if self.lanes.newborn and ow is None and engine is None and shared.backwards:
            # a run rebuilt to resume: the abandoned model's backwards are not this window's
            unborn = self.lanes.unborn(opt, self.backward_total - len(shared.backwards))
            if 0 < unborn < len(shared.backwards):
                self._ow = ow = shared.without_first(unborn)
                ow.began_on_grad = self.lanes.held_at_first(opt)
                self._unborn = unborn
        w = shared if ow is None else ow
        if self.lanes.first_reads and ow is None and engine is None and w.began_on_grad is None:
            w.began_on_grad = self.lanes.held_at_first(opt)  # (its first window: read at its first backward)
        self._step_checksum = None
        self._step_members = None
        self._step_master = None
        self._step_bw0 = self.backward_total
        if self._tracking() and w.starts and len(w.starts) == len(w.ends):
            t0 = time.perf_counter()
            # a collective writes .grad in place without bumping its version (c10d): after
            # one since the last backward the checksum is taken again
            same = (ow is None and not w.reductions_between
                    and self._collectives_seen == self._end_collectives
                    and grad_versions(self._tracked) == self._end_versions)
            self._step_checksum = w.ends[-1] if same else self._checksums()
            members = {id(p) for g in getattr(opt, "param_groups", []) for p in g["params"]}
            self._step_members = [id(p) in members for p in self._tracked]
            if engine is None and not all(self._step_members):
                # bf16 model .grad summed in place, fp32 copies stepped (master weights)
                with self._quiet():
                    self._step_master = model_grad_sum(
                        self._tracked, self._step_members, w.starts, w.ends,
                        [p for g in getattr(opt, "param_groups", []) for p in g["params"]])
                    master = self._step_master
                    if master is not None and master.get("reached") is False \
                            and self._collectives_seen != self._end_collectives:
                        # a collective since the last backward (a hand all-reduce of the
                        # masters' gradients) mixes in the other ranks' sums: the copy
                        # cannot be paired by proportion on one rank, which is not a "no"
                        master["reached"] = None
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
        fns = self._handlers.on_step_start
        if not fns:
            return
        ev = StepStartEvent(
            step=self.step, backwards=len(w.backwards),
            source="torch" if engine is None else "deepspeed", applied=applied,
            engine=self.engine, conservation=self._step_cons,
            owner=opt if engine is None else engine, in_backward=self._bw_current is not None)
        for fn in fns:
            fn(ev)

    def _verdict(self) -> Conservation | None:
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
            coef = _clip_coefficient(w.norm_clip) \
                if w.clip_micros and w.clip_micros[-1] == len(w.backwards) else None
            if coef is not None:
                cons = replace(cons, clip=coef)
        self._t_checks += time.perf_counter() - t0
        return cons

    @staticmethod
    def _grad_state(opt: object) -> list[tuple[int, int]]:
        # at every step: the loops over the parameters are C's (map, zip), and each .grad is
        # read once (its property builds the Python object at every read)
        params = chain.from_iterable(map(_PARAMS, getattr(opt, "param_groups", [])))
        grads = [g for g in map(_GRAD, params) if g is not None]
        return list(zip(map(id, grads), map(_VERSION, grads), strict=True))

    def _no_new_grad(self, opt: object) -> bool:
        """No gradient reached ``opt`` since its previous step: its ``.grad`` tensors are
        those it stepped on, unwritten since, or every one is zero."""
        if self._grad_state(opt) == self._last_grads:
            return True
        with self._quiet():
            return all(not bool(local(p.grad).any()) for g in getattr(opt, "param_groups", [])
                       for p in g["params"] if p.grad is not None)

    def _end_step(self, source: str, opt_name: str, applied: bool, norm: float | None,
                  owner: object, *, discarded: bool = False, state_init: bool = False) -> None:
        w = self._w
        own, self._ow = self._ow, None
        if own is not None and source == "torch" and self.backward_total > self._step_bw0 \
                and not self._unborn:
            # backwards inside the step (a closure: Lightning's automatic optimisation runs
            # the window's last micro-step there) came after this optimizer's own window was
            # cut from the log at the step's start: cut it again, with them
            again = self.lanes.window(owner, w, self.backward_total, len(self._tracked))
            own = own if again is None else again
        unborn, self._unborn = self._unborn, 0
        same = own is None or (len(own.backwards) == len(w.backwards)
                               and all(a is b for a, b in zip(own.backwards, w.backwards,
                                                              strict=True)))
        lr_changes, lr = self.lr_trace.take()
        # a DeepSpeed step's owner is its engine; a torch step's, its optimizer
        ds_engine = owner if source == "deepspeed" and isinstance(owner, torch.nn.Module) \
            else None
        if source == "torch" and not state_init:  # (DCP's step: the optimizer's first is ahead)
            self.lanes.stepped(owner, self.backward_total)
            self._last_grads = self._grad_state(owner)
        updates = None
        before: dict[str, torch.Tensor] | None
        if self.record_updates and self._before is not None and applied:
            after = self._snapshot(owner if source == "torch" else None, ds_engine)
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
            after = self._snapshot(owner if source == "torch" else None, ds_engine)
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
            if not armed and not w.unusual(self.window_size) and not lr_changes:
                self._next_window()
                return
        if not self._handlers.on_step:
            # No listener takes the step record (the guard): skip building it (the window
            # loss reduction, its host copy and a dozen per-window lists).
            self._next_window()
            return
        chk = None
        # a backward inside the step (a closure: Lightning's automatic optimisation runs the
        # window's last micro-step there) came after the checksum: it is not what the
        # optimizer received, so it is not recorded (the ranks would be compared on it)
        loose_chk = None
        if cons is not None and self._step_members is not None \
                and self._step_checksum is not None and self.backward_total == self._step_bw0:
            mask = torch.tensor(self._step_members, dtype=torch.bool)
            chk = [float(x) for x in self._step_checksum[mask].sum(0)]
            if self.engine == "fsdp2":
                loose_chk = self._loose_checksum()
        precision = self._precision(owner, source, w)
        # a torch step with every gradient None changes nothing: its window goes on;
        # a DeepSpeed step that skipped its update (overflow) discarded its window
        losses = self.losses.take(applied, carry=source == "torch" and not discarded)
        terms = self.losses.take_terms()  # the terms and log-prob selections (_losses_terms)
        scales = None if same or own is None else \
            lane_scales(own, w, losses, terms, self.losses.done_last)
        if self._pass_end_next(w) and applied and not self.losses.on:
            self.losses.on = True  # a pass's last window: F7 is judged from its loss record
        # the ledger composes the loss weights with the engine's reduction
        factor = rank_factor(self.engine, self._sync_roots, self._fsdp_groups,
                             self._ds_engine) if losses or terms else None
        split = unit_factors(self.engine, self._fsdp_groups) if factor is None and (losses or terms) \
            else None
        ev = (w if own is None else own).record(
            step=self.step, applied=applied, source=source, optimizer=opt_name,
            engine=self.engine, grad_norm=norm, conservation=cons, checksum=chk,
            wall=time.perf_counter() - self._step_t0, param_dtype=self._dtype_of(owner),
            updates=updates, precision=precision,
            param_norm=(None if updates is None or before is None else
                        float(sum(float(v.pow(2).sum()) for v in before.values())) ** 0.5),
            # with its own window, the loss record follows the shared window's backwards,
            # not this optimizer's, unless they are the same backwards (an optimizer left
            # behind by a model rebuilt on resume: the new one's window is the shared one)
            losses=losses if same else None, discarded=discarded, moved=moved,
            terms=terms if same else None,
            rank_factor=factor, rank_factor_units=split,
            fsdp_mesh=fsdp2_mesh(self.engine, self._fsdp_groups) if factor == 1.0 else None,
            optimizer_index=None if own is None or unborn else self.lanes.key(owner),
            lr_changes=lr_changes, lr=lr,
            # an optimizer stepped from a gradient hook, inside a backward pass
            in_backward=self._bw_current is not None,
            # (backward_total counts a backward pass when it ends: this one's ordinal)
            backward_pass=self.backward_total if self._bw_current is not None else None,
            grad_hooks=bool(losses or terms) and self._grad_hooked(owner),
            opt_serial=self._serial(owner), unborn=unborn,
            unwrapped=(unwrapped := self._unwrapped(owner)
                       if self.engine in ("ddp", "fsdp2", "deepspeed") else None),
            # their .grad when the step's checksum does not cover them (not kept, or they
            # are not the wrapped model's: a head kept in a plain dict)
            loose_checksum=loose_chk if loose_chk is not None or not unwrapped
            or (chk is not None and not self._loose_untracked(owner))
            else self._loose_grads(owner),
            join_initial=self._join_initial() if self.engine == "ddp" else None,
            pre_hooked=bool(getattr(owner, "_optimizer_step_pre_hooks", None)),
            lane_scales=scales)
        self._next_window(reset_losses=False)  # losses.take() above reset them
        if self._global_handle is not None and self.step >= PIN_ROOTS_AFTER_STEPS:
            self._pin_roots()
        for fn in self._handlers.on_step:
            fn(ev)
        if self.observe_steps is not None and self._retire_due(w):
            for end in self._handlers.on_retire:
                end(self.step)
            # once the patches are gone, the run's totals go on being counted (_tail)
            self.failsafe.on_teardown(self._start_tail)
            self.failsafe.retire()

    def _join_initial(self) -> bool | None:
        """DDP's ``divide_by_initial_world_size``, which only ``Join`` sets (None: unset)."""
        for r in self._sync_roots:
            flag = getattr(r, "_divide_by_initial_world_size", None)
            if isinstance(flag, bool):
                return flag
        return None

    def _pass_end_next(self, w: StepTally) -> bool:
        """The next window, as long as this one, reaches the end of the current pass over
        the DataLoader (its length from the first pass): its loss is recorded whatever the
        recorder's time budget says, since a short last window shows only there."""
        if w.data_passes:
            self._pass_bw0 = self.backward_total - len(w.backwards) + w.data_passes[-1]
        if self._pass_len is None or self._pass_bw0 is None:
            return False
        left = self._pass_len - (self.backward_total - self._pass_bw0)
        return 0 < left <= max(1, len(w.backwards))

    def _retire_due(self, w: StepTally) -> bool:
        """After the window ``w`` (``self.step`` windows recorded), has the run been seen
        long enough (``observe_steps``)? Bugs of the loop's shape show in every window, so
        its first windows settle them; a bug at an epoch's end shows once per pass, so
        observation goes on through the first pass's end and the next pass's first window
        when that end is in reach (within :data:`OBSERVE_MAX` steps, predicted from the
        DataLoader's length), and ends at once when it is not, or no length is known."""
        done, limit = self.step, self.observe_steps or 0
        if w.data_passes:
            self._pass_at.append(done - 1)
        if done < limit:
            return False
        if done >= max(limit, OBSERVE_MAX) or not self._pass_at:
            return True
        if len(self._pass_at) >= 2:
            return done >= self._pass_at[-1] + 2
        per_window = len(w.backwards)
        if self._pass_len is None or per_window < 1:
            return True
        ends = self._pass_at[0] + -(-self._pass_len // per_window)
        return ends + 2 > max(limit, OBSERVE_MAX)

    def _serial(self, owner: object) -> int:
        """``owner``'s number in the order of the optimizers' (engines') first steps."""
        n = self._opt_serials.get(owner)
        if not n:
            self._n_serials += 1
            n = self._opt_serials.set(owner, self._n_serials)
        return n

    def _grad_hooked(self, owner: object) -> bool:
        """Whether a parameter of this step (the roots' tracked ones, else the optimizer's)
        has a tensor hook, which may rescale its gradient between the loss and ``.grad``
        (one attribute read per parameter, on steps with a loss record only)."""
        params = self._tracked or [p for g in getattr(owner, "param_groups", [])
                                   for p in g["params"]]
        return any(getattr(p, "_backward_hooks", None) for p in params)

    def _param_versions(self) -> list[int] | None:
        """``_version`` of up to 9 tracked parameters, evenly spaced (read at a window's first
        backward; a handful of attribute reads). None where an engine changes parameters
        in place by itself (FSDP2's all-gathers, DeepSpeed's partitions) or none is tracked."""
        tracked = self._tracked  # (inlined in BackwardPath._run_backward: keep them alike)
        if not tracked or self.engine not in ("local", "ddp"):
            return None
        return [tracked[i]._version for i in range(0, len(tracked), max(1, len(tracked) // 8))]

    def _perturbed(self) -> bool:
        """At a zero_grad inside the window: the parameters changed in place since its first
        backward, and no optimizer stepped (any step begins a new window): a two-pass step
        (sharpness-aware minimisation's ascent, a weight perturbation), not a reset of the
        accumulated gradient."""
        before = self._w.param_versions
        now = self._param_versions() if before is not None else None
        return now is not None and len(now) == len(before or ()) and now != before

    def _restart_window(self) -> None:
        """Begin the window again at this zero_grad (see :meth:`_perturbed`): its backwards so
        far were the perturbation's probe; the window judged is the pass after it (same
        optimizer step, same checks)."""
        old = self._w
        self._w = w = StepTally()
        w.restarts = old.restarts + 1
        w.data_passes = [0] * len(old.data_passes)  # a pass begun in the probe: this window's
        w.autocast_read, w.autocast = old.autocast_read, old.autocast
        self._window_checked = None if self._armed else False
        if self.boundary is not None:
            self.boundary.reset()
        self.losses.reset()

    def _next_window(self, *, reset_losses: bool = True) -> None:
        self.step += 1
        self._w = StepTally()
        self._window_checked = None if self._armed else False  # unarmed: no checksums
        if self.drift.shadows:
            self.drift.next_window()  # (and whether the next window is shadowed)
        if self.boundary is not None:
            self.boundary.reset()
        if reset_losses:
            self.losses.reset()

    def _checksums(self) -> torch.Tensor:
        with self._quiet():
            return checksums(self._tracked)

    def _snapshot(self, opt: object, engine: torch.nn.Module | None) -> dict[str, torch.Tensor]:
        with self._quiet():
            return snapshot(opt, engine, self._tracked_names)


def _clip_coefficient(norm_clip: tuple[object, object] | None) -> float | None:
    """The factor a norm clip applied, ``min(1, max_norm / (norm + 1e-6))`` as torch's
    ``clip_grad_norm_`` computes it, from the max_norm and the norm it returned (one host
    read, on a checked window that clipped only); None when either cannot be read."""
    if norm_clip is None:
        return None
    limit, norm = norm_clip
    if not isinstance(limit, int | float) or isinstance(limit, bool) or limit <= 0:
        return None
    if isinstance(norm, torch.Tensor) and norm.numel() == 1:
        value = float(norm.detach())
    elif isinstance(norm, int | float) and not isinstance(norm, bool):
        value = float(norm)
    else:
        return None
    if not math.isfinite(value):
        return None
    return min(1.0, float(limit) / (value + 1e-6))
