"""The backward path of the observer: the bookkeeping around each backward pass.

A mixin of :class:`~._observer.Observer` (the patches of ``Tensor.backward``,
``torch.autograd.backward``, DeepSpeed's and Accelerate's ``backward`` call
``obs._run_backward``): the hot path of every micro-step, so it reads and writes the
observer's window and counters directly. A backward in a window ``sampled_records`` left
unarmed is only counted (:meth:`BackwardPath._run_unobserved_backward`); an armed one gets
its sync flags, DeepSpeed's boundary flags, the gradient checksums before and after
(:mod:`._checksum`) and the listeners' ``on_backward_start``/``on_backward``.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import torch

from accumguard.observe._checksum import grad_versions
from accumguard.observe._events import BackwardEvent
from accumguard.observe._window import StepTally

if TYPE_CHECKING:
    from accumguard.observe._attribution import Attribution
    from accumguard.observe._boundary import BoundaryScale
    from accumguard.observe._events import Handlers
    from accumguard.observe._failsafe import Original
    from accumguard.observe._lanes import Lanes
    from accumguard.observe._losses import LossRecorder
    from accumguard.observe._lr_trace import LrTrace
    from accumguard.observe._precision import AccumDrift

__all__ = ["BackwardPath"]


class BackwardPath:
    """``_run_backward`` and ``_run_unobserved_backward`` (state: the observer's, set up in
    ``Observer.__init__``)."""

    # (attributes of the observer this mixin uses; typed here for readers and checkers)
    roots: dict[int, torch.nn.Module]
    engine: str
    step: int
    installed: bool
    attribute: bool
    window_loss: bool
    backward_total: int
    boundary: BoundaryScale | None
    lanes: Lanes
    losses: LossRecorder
    lr_trace: LrTrace
    _in_observer: int
    _opt_depth: int  # optimizer steps running (a closure's backward runs inside one)
    _engine_bws: dict[int, list[BackwardEvent]]
    _armed: bool
    _wants_backwards: bool
    _w: StepTally
    _handlers: Handlers
    _attribution: Attribution
    _sync_roots: list[torch.nn.Module]
    _given_roots: list[torch.nn.Module]
    _ds_engine: torch.nn.Module | None  # DeepSpeed's engine (an nn.Module)
    _tracked: list[torch.Tensor]
    _fsdp_groups: dict[int, list[object]]
    drift: AccumDrift
    _end_versions: list[tuple[int, int] | None]
    _collectives_seen: int
    _end_collectives: int
    _window_checked: bool | None
    _t_checks: float
    _bw_depth: int
    _last_sync_forward: bool | None
    _sync_root: torch.nn.Module | None
    _bw_current: BackwardEvent | None

    if TYPE_CHECKING:  # defined by the observer and its other mixins
        def _add_root(self, module: torch.nn.Module) -> None: ...
        def _sync_flag(self, root: torch.nn.Module) -> bool | None: ...
        def _tracking(self) -> bool: ...
        def _checksums(self) -> torch.Tensor: ...
        def _watch_drift(self) -> None: ...

    def _run_backward(self, source: str, loss: object, engine: torch.nn.Module | None,
                      fn: Original, args: tuple[object, ...],
                      kwargs: dict[str, object]) -> object:
        """One backward pass: ``fn(*args, **kwargs)`` between the before/after bookkeeping.
        The hot path of every micro-step: plain attribute work and one event object."""
        if self._bw_depth or not self.installed or self._in_observer:
            return fn(*args, **kwargs)
        w = self._w
        if not w.backwards and w.param_versions is None:
            # (StepMachinery._param_versions inlined: once per window, on the hot path)
            tracked = self._tracked
            if tracked and self.engine in ("local", "ddp"):
                pv: list[int] = []
                for i in range(0, len(tracked), max(1, len(tracked) // 8)):
                    pv.append(tracked[i]._version)
                w.param_versions = pv
        if not self._armed and not self._wants_backwards:
            return self._run_unobserved_backward(source, w, fn, args, kwargs)
        ev = BackwardEvent(step=self.step, micro=len(w.backwards), source=source,
                           engine=self.engine, forwards=w.forwards,
                           new_pass=bool(w.data_passes) and w.data_passes[-1] == len(w.backwards))
        if self.attribute and self._given_roots:
            ev.reached = self._attribution.reaches(loss)
        w.forwards = 0
        if w.loss_ok:
            if not self.window_loss or not self._handlers.on_step:
                # Only the step record reads the window loss (no listener takes it: the
                # guard): keep no loss tensors; a listener added later sees it unknown.
                w.loss_ok = False
            elif isinstance(loss, torch.Tensor) and loss.numel() == 1:
                # a CPU loss is read now (one host read, no device to wait for: cheaper
                # than keeping a detached tensor and stacking them at the step); a device
                # loss is kept and read once per window, at the step
                w.losses.append(loss.item() if type(loss) is torch.Tensor and loss.device.type == "cpu"
                                else loss.detach())
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
                # DeepSpeedEngine's own method (to the checker the engine is an nn.Module)
                flag = getattr(engine, "is_gradient_accumulation_boundary")  # noqa: B009
                ev.ds_boundary = bool(flag())
                ev.ds_coalescing = bool(getattr(engine, "inside_no_sync_ctxt", False))
                mid = getattr(getattr(engine, "optimizer", None), "micro_step_id", None)
                ev.ds_micro_id = mid if type(mid) is int else None
        # an unchecked window stays unchecked: skip the call on the hot path
        track = False if self._window_checked is False else self._tracking()
        if track:
            t0 = time.perf_counter()
            # Unchanged grads since the previous backward's end (same tensors, same in-place
            # version, no collective since, which would write .grad without bumping its
            # version): reuse that checksum instead of recomputing it.
            versions = grad_versions(self._tracked)
            if w.ends and versions == self._end_versions \
                    and self._collectives_seen == self._end_collectives:
                w.starts.append(w.ends[-1])
            elif not w.ends and all(v is None for v in versions):
                w.starts.append(torch.zeros((len(self._tracked), 3), dtype=torch.float64))
            else:
                w.starts.append(self._checksums())
            self._t_checks += time.perf_counter() - t0
        if self.drift.key != (len(self._tracked), len(self._fsdp_groups)):
            self._watch_drift()  # (compared here: a call per backward shows in the hot path)
        handlers = self._handlers
        for listen in handlers.on_backward_start:
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
                self._end_collectives = self._collectives_seen
                self._t_checks += time.perf_counter() - t0
            if lane is not None:
                checked = track and len(w.starts) == len(w.ends) == n_ends + 1
                self.lanes.after_backward(
                    lane, self.backward_total, ev, w.starts[-1] if checked else None,
                    w.ends[-1] if checked else None,
                    w.losses[-1] if w.loss_ok and w.losses else None)
            w.backwards.append(ev)
            self.losses.end_backward()
            self.lr_trace.at_backward(self._opt_depth)
            w.bw_since_engine_step += 1
            if engine is not None:
                # (the engine's accumulation counts engine.backward calls: a plain
                # loss.backward() beside them is no micro-step of the engine's)
                w.engine_bw_since_step += 1
                self._engine_bws.setdefault(id(engine), []).append(ev)
            w.zero_since_backward = 0
            self.backward_total += 1
            if self.boundary is not None:
                self.boundary.after_backward()
            for listen in handlers.on_backward:
                listen(ev)

    def _run_unobserved_backward(self, source: str, w: StepTally, fn: Original,
                                 args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        """A backward in an unarmed window (``sampled_records``): counted, no sync flag,
        engine query or checksum (the window's record, when :meth:`.StepTally.unusual` asks for it,
        leaves those unknown)."""
        ev = BackwardEvent(step=self.step, micro=len(w.backwards), source=source,
                           engine=self.engine, forwards=w.forwards,
                           new_pass=bool(w.data_passes) and w.data_passes[-1] == len(w.backwards))
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
            self.lr_trace.at_backward(self._opt_depth)
            w.bw_since_engine_step += 1
            if source == "deepspeed" or (source == "accelerate" and self._ds_engine is not None):
                w.engine_bw_since_step += 1
                # (whose engine ran it is not read here: the engines' own windows end)
                self._engine_bws[-1] = []
            w.zero_since_backward = 0
            self.backward_total += 1
