"""Several optimizers: each one's own window (the backwards that reached its parameters).

A GAN steps its discriminator every batch (with its own ``zero_grad``) while its generator
accumulates K batches; an actor and a critic, per-head optimizers, optimizers at different
rates do the same. One window per optimizer step of *any* optimizer (the observer's
:class:`~._window.StepTally`) then mixes them: the generator's window is cut at every
discriminator step (its earlier micro-steps look like stale gradient), and the
discriminator's ``zero_grad`` clears what the generator's backward left on the
discriminator's parameters (it looks like F3).

:class:`Lanes` keeps, once a second optimizer over *disjoint* parameters exists, a log of
the backwards (which parameters' ``.grad`` each one changed, its gradient checksums) and of
the ``zero_grad`` calls (on which parameters), and builds at an optimizer's step the window
of that optimizer: the backwards since its previous step that reached its parameters.
A backward whose gradient on this optimizer's parameters was cleared by a ``zero_grad``
before a later backward of the window is left out when it is cross-talk: it also reached
another optimizer's parameters, and no backward of that same kind (the same optimizers
reached) is kept in this window (the generator's loss reaches the discriminator's weights;
the discriminator clears them before its own backward). A cleared backward of this
optimizer's own kind stays in, and conservation judges it (the generator's own
``zero_grad`` inside its window is still F3).

With one optimizer (or optimizers sharing parameters: a wrapper and its inner optimizer,
ZeRO's shard) nothing here changes the window.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from accumguard.observe._events import BackwardEvent
from accumguard.observe._introspect import local
from accumguard.observe._window import StepTally

__all__ = ["Lanes", "lane_scales"]

#: Backward passes the log keeps at most (an optimizer that never steps must not make it
#: grow without end); a window reaching further back is left to the shared window.
LOG_LIMIT = 4096


@dataclass
class _Lane:
    key: int  # 1-based, by first appearance
    since: int  # serial of the first backward of its current window
    pids: frozenset[int] = frozenset()
    n_params: int = -1
    steps: int = 0  # windows of this optimizer ended so far
    # backward passes done when it was made, if none of its parameters held a gradient then
    # (the backwards before it cannot be in its first step's gradient)
    born: int | None = None
    # for such an optimizer: did its parameters hold a gradient at the first backward after
    # it was made (a resume that restored the saved partial window's gradient into .grad
    # after building the optimizer); None until that backward
    held_at_first: bool | None = None
    read_first: bool = False  # made after some optimizer had stepped: read at its first backward


@dataclass
class _Entry:
    serial: int
    ev: BackwardEvent
    touched: frozenset[int]  # id() of the parameters whose .grad this backward changed
    start: torch.Tensor | None = None  # gradient checksums (all tracked parameters)
    end: torch.Tensor | None = None
    loss: torch.Tensor | float | None = None
    # parameters that held a nonzero gradient before it, when asked (an optimizer that has
    # not stepped yet after another one had: a resumed run may have restored its window's
    # gradient into .grad); None when not read
    held: frozenset[int] | None = None


@dataclass
class _Zero:
    serial: int  # backward passes done when it ran
    pids: frozenset[int]


@dataclass
class _Pending:
    versions: list[tuple[int, int] | None]
    params: list[torch.Tensor] = field(default_factory=list)
    held: frozenset[int] | None = None


def _pids(opt: object) -> frozenset[int]:
    return frozenset(id(p) for g in getattr(opt, "param_groups", None) or [] for p in g["params"])


def _count(opt: object) -> int:
    return sum(len(g["params"]) for g in getattr(opt, "param_groups", None) or [])


def _versions(params: list[torch.Tensor]) -> list[tuple[int, int] | None]:
    out: list[tuple[int, int] | None] = []
    for p in params:
        g = p.grad
        out.append(None if g is None else (id(g), int(g._version)))
    return out


def _holds_grad(p: object) -> bool:
    """``p.grad`` holds a gradient: set and not all zero (a meta tensor counts as held)."""
    grad = getattr(p, "grad", None)
    return grad is not None and (grad.is_meta or bool(local(grad).any()))


class Lanes:
    """The optimizers of the process and, with several on disjoint parameters, the log
    their own windows are built from (see the module docstring)."""

    def __init__(self) -> None:
        self._lanes: weakref.WeakKeyDictionary[object, _Lane] = weakref.WeakKeyDictionary()
        self._next_key = 1
        self.log: list[_Entry] = []
        self.zeros: list[_Zero] = []
        self._floor = 0  # backwards before this serial are not in the log (trimmed, or unlogged)
        self._params: list[torch.Tensor] | None = None  # every lane's parameters, deduplicated
        self._shape: tuple[int, int] = (0, 0)
        self._several = False
        self._several_shape: tuple[int, int] = (0, 0)
        # optimizers made with no gradient on their parameters that have not stepped yet:
        # the step path asks :meth:`unborn` only while there is one (a read, not a call)
        self.newborn = 0
        self.unread = 0  # optimizers made after a step whose first backward is still ahead
        # optimizers whose gradient at their first backward was read and that have not
        # stepped yet: the step path asks :meth:`held_at_first` only while there is one
        self.first_reads = 0
        self._stepped_any = False  # some optimizer of the process has stepped

    # -- registry -------------------------------------------------------------------------
    def _get(self, opt: object) -> _Lane | None:
        try:
            return self._lanes.get(opt)
        except TypeError:  # an optimizer class that is not hashable or weak-referenceable
            return None

    def register(self, opt: object, serial: int) -> _Lane | None:
        """Know ``opt`` from now on (its window starts at backward ``serial``); None when
        it cannot be kept (unhashable, no weak reference): it is then left to the shared
        window."""
        lane = self._get(opt)
        if lane is None:
            lane = _Lane(self._next_key, serial)
            try:
                self._lanes[opt] = lane
            except TypeError:
                return None
            self._next_key += 1
            self._params = None
        return lane

    def birth(self, opt: object, serial: int) -> None:
        """``opt`` was just made, after ``serial`` backward passes. When none of its
        parameters holds a gradient (every ``.grad`` None or zero), no earlier backward is
        in the gradient of its first step: a run rebuilt to resume (a new model and a new
        optimizer after an abandoned one's backwards) starts its first window here."""
        lane = self._get(opt)
        if lane is None:
            return
        if self._stepped_any and not lane.steps and not lane.read_first:
            lane.read_first = True  # (a run rebuilt to resume: its first window is judged)
            self.unread += 1
        for g in getattr(opt, "param_groups", None) or []:
            for p in g["params"]:
                if hasattr(p, "device_mesh"):
                    return  # an FSDP2 shard: with sync off its gradient waits outside .grad
                if _holds_grad(p):
                    return
        if lane.born is None and not lane.steps:
            self.newborn += 1
        lane.born = serial

    def unborn(self, opt: object, start: int) -> int:
        """How many of the backward passes from ``start`` on ran before ``opt`` was made
        with no gradient on its parameters (0 when it held one then, or has stepped)."""
        lane = self._get(opt)
        if lane is None or lane.born is None or lane.steps:
            return 0
        return max(0, lane.born - start)

    def held_at_first(self, opt: object) -> bool | None:
        """For an optimizer that has not stepped yet, made with no gradient on its parameters
        or after another optimizer had stepped: whether they held one at the first backward
        after it was made (None: not known, or it has stepped)."""
        lane = self._get(opt)
        return None if lane is None or lane.steps else lane.held_at_first

    def _look_at_newborns(self) -> None:
        """At a backward, while an optimizer made without gradients (or made after another
        one had stepped) has not stepped: read its parameters' gradients once, at its first
        backward (a resume restores the saved window's gradient between making the optimizer
        and that backward)."""
        for opt, lane in list(self._lanes.items()):
            if lane.read_first:
                lane.read_first = False
                self.unread -= 1
            elif lane.born is None:
                continue
            if lane.steps or lane.held_at_first is not None:
                continue
            self.first_reads += 1
            lane.held_at_first = any(
                _holds_grad(p)
                for group in getattr(opt, "param_groups", None) or [] for p in group["params"])
        self.unread = 0  # (every flag was cleared above; one collected unread is not waited on)

    def _refresh(self, opt: object, lane: _Lane) -> None:
        n = _count(opt)
        if n != lane.n_params:  # add_param_group
            lane.pids, lane.n_params = _pids(opt), n
            self._params = None

    def several(self) -> bool:
        """Two live optimizers over disjoint parameters exist: the log is kept."""
        if len(self._lanes) < 2:
            return False
        shape = (len(self._lanes), sum(max(0, ln.n_params) for ln in self._lanes.values()))
        if shape != self._several_shape:
            self._several_shape = shape
            items = list(self._lanes.items())
            for opt, lane in items:
                self._refresh(opt, lane)
            self._several = any(a.pids and b.pids and not (a.pids & b.pids)
                                for i, (_, a) in enumerate(items) for _, b in items[i + 1:])
        return self._several

    def young(self, n: int) -> bool:
        """Several optimizers over disjoint parameters, and one of them has ended fewer than
        ``n`` windows: its first windows span many of the shared ones (a generator's window
        of K discriminator steps), so they are checked whatever the time budget."""
        return self.several() and any(ln.steps < n for ln in list(self._lanes.values()))

    def partners(self, opt: object) -> list[tuple[object, _Lane]]:
        """The other live optimizers over parameters disjoint from ``opt``'s."""
        lane = self._get(opt)
        if lane is None or len(self._lanes) < 2:
            return []
        self._refresh(opt, lane)
        out = []
        for other, ol in list(self._lanes.items()):
            if other is opt:
                continue
            self._refresh(other, ol)
            if ol.pids and lane.pids and not (ol.pids & lane.pids):
                out.append((other, ol))
        return out

    def key(self, opt: object) -> int | None:
        lane = self._get(opt)
        return None if lane is None else lane.key

    # -- recording ------------------------------------------------------------------------
    def _all_params(self) -> list[torch.Tensor]:
        shape = (len(self._lanes), sum(max(0, ln.n_params) for ln in self._lanes.values()))
        if self._params is None or shape != self._shape:
            seen: set[int] = set()
            params: list[torch.Tensor] = []
            for opt, lane in list(self._lanes.items()):
                self._refresh(opt, lane)
                for g in getattr(opt, "param_groups", None) or []:
                    for p in g["params"]:
                        if id(p) not in seen:
                            seen.add(id(p))
                            params.append(p)
            self._params = params
            self._shape = (len(self._lanes),
                           sum(max(0, ln.n_params) for ln in self._lanes.values()))
        return self._params

    def before_backward(self, serial: int) -> _Pending | None:
        """Before backward number ``serial`` (0-based): the ``.grad`` versions to compare
        after it, when the log is kept."""
        if self.newborn or self.unread:
            self._look_at_newborns()
        # (one optimizer ever registered: no call; _next_key - 1 counts every registration,
        # so it never misses a live second one; several() decides the rest exactly)
        if self._next_key < 3 or not self.several():
            self._floor = serial + 1  # a window from before this one is not in the log
            return None
        params = self._all_params()
        held = None
        if self._unstepped_after_step():
            # one read of each gradient, only until such an optimizer has stepped once
            held = frozenset(id(p) for p in params
                             if p.grad is not None and bool(local(p.grad).any()))
        return _Pending(_versions(params), params, held)

    def _unstepped_after_step(self) -> bool:
        """An optimizer that has not stepped yet, made after some optimizer of the process
        had stepped (a run rebuilt to resume, a second stage): its first window may
        continue a restored one."""
        return self._stepped_any and any(ln.steps == 0 for ln in list(self._lanes.values()))

    def after_backward(self, pending: _Pending | None, serial: int, ev: BackwardEvent,
                       start: torch.Tensor | None, end: torch.Tensor | None,
                       loss: torch.Tensor | float | None) -> None:
        if pending is None:
            return
        after = _versions(pending.params)
        touched = frozenset(id(p) for p, a, b in zip(pending.params, pending.versions, after,
                                                     strict=False) if a != b)
        self.log.append(_Entry(serial, ev, touched, start, end, loss, pending.held))
        if len(self.log) > LOG_LIMIT:
            drop = len(self.log) - LOG_LIMIT
            self._floor = self.log[drop].serial
            del self.log[:drop]

    def on_zero(self, target: object, kind: str, serial: int) -> None:
        """A ``zero_grad`` (outside any step): on which parameters, after how many backwards."""
        if self._next_key < 3 or not self.several():
            return
        if kind == "optimizer":
            lane = self._get(target)
            if lane is not None:
                self._refresh(target, lane)
                pids = lane.pids
            else:
                pids = _pids(target)
        else:
            if not isinstance(target, torch.nn.Module):  # clears nothing we can name
                return
            try:
                pids = frozenset(id(p) for p in target.parameters())
            except Exception:  # a module whose parameters cannot be listed
                return
        self.zeros.append(_Zero(serial, pids))

    def stepped(self, opt: object, serial: int) -> None:
        """``opt``'s window ended (``serial`` backwards so far); the log keeps what the other
        optimizers' open windows still need."""
        self._stepped_any = True
        lane = self._get(opt)
        if lane is not None:
            lane.since = serial
            if lane.born is not None and not lane.steps:
                self.newborn -= 1
            if lane.held_at_first is not None and not lane.steps:
                self.first_reads -= 1
            lane.steps += 1
        if not self.log and not self.zeros:
            return
        low = min((ln.since for ln in self._lanes.values()), default=serial)
        if self.log and self.log[0].serial < low:
            self.log = [e for e in self.log if e.serial >= low]
        self.zeros = [z for z in self.zeros if z.serial > low]

    # -- an optimizer's own window ------------------------------------------------------------
    def _attributed(self, every: frozenset[int]) -> dict[int, frozenset[int]]:
        """The parameters each logged backward reached. A backward that changed no ``.grad``
        (an FSDP2 micro-step with gradient sync off: its gradient waits in FSDP2's unsharded
        buffers) reached what the next backward that changed some did (the synchronising
        micro-step, whose reduce-scatter hands the accumulated gradient to the sharded
        ``.grad``); with none after it yet, every optimizer's parameters (``every``). An
        FSDP2 micro-step with sync off that changed only plain parameters' ``.grad`` reached
        the shards the next synchronising micro-step hands a gradient to as well."""
        out: dict[int, frozenset[int]] = {}
        after = every
        sharded = self._sharded()
        after_sharded = every & sharded
        for e in reversed(self.log):
            if e.touched:
                after = e.touched
            if e.touched & sharded:
                after_sharded = e.touched & sharded
            reached = e.touched or after
            if e.ev.engine == "fsdp2" and False in (e.ev.sync_forward, e.ev.sync_backward) \
                    and not e.touched & sharded:
                # it also changed plain parameters (a temperature outside the sharded
                # model): its share of the FSDP2 parameters' gradient waits in the
                # unsharded buffers for the synchronising micro-step's
                reached = reached | after_sharded
            out[id(e)] = reached
        return out

    def _sharded(self) -> frozenset[int]:
        """The FSDP2 shards among the lanes' parameters (DTensors: their ``.grad`` is
        written only by a synchronising micro-step's reduce-scatter)."""
        return frozenset(id(p) for p in self._all_params() if hasattr(p, "device_mesh"))

    def window(self, opt: object, shared: StepTally, serial: int, tracked: int) -> StepTally | None:
        """The window of ``opt`` (a torch optimizer about to step after ``serial`` backward
        passes), or None when the shared window is its window (one optimizer, optimizers
        sharing parameters, a window older than the log). ``tracked``: the number of
        parameters the observer's gradient checksums cover now."""
        partners = self.partners(opt)
        if not partners:
            return None
        lane = self._get(opt)
        if lane is None or lane.since < self._floor:
            return None
        mine = lane.pids
        lanes = [(lane, mine)] + [(ol, ol.pids) for _, ol in partners]
        touched = self._attributed(mine.union(*(pids for _, pids in lanes)))
        entries = [e for e in self.log if e.serial >= lane.since and touched[id(e)] & mine]

        def reach(e: _Entry) -> frozenset[int]:
            return frozenset(ln.key for ln, pids in lanes if touched[id(e)] & pids)

        zeros = [z for z in self.zeros if z.pids & mine]
        if entries:
            # the last clear of these parameters between two of its backwards
            cut = [z.serial for z in zeros if entries[0].serial < z.serial <= entries[-1].serial]
            if cut:
                lost = [e for e in entries if e.serial < cut[-1]]
                kept = [e for e in entries if e.serial >= cut[-1]]
                own = {reach(e) for e in kept} | {frozenset({lane.key})}
                if not any(reach(e) in own for e in lost):
                    entries = kept  # cross-talk another optimizer's backward left here
        w = StepTally()
        w.backwards = [e.ev for e in entries]
        if entries and all(e.start is not None and e.end is not None
                           and e.start.shape[0] == tracked and e.end.shape[0] == tracked
                           for e in entries):
            w.starts = [e.start for e in entries]  # type: ignore[misc]
            w.ends = [e.end for e in entries]  # type: ignore[misc]
        if entries and all(e.loss is not None for e in entries):
            w.losses = [e.loss for e in entries]  # type: ignore[misc]
        else:
            w.loss_ok = False
        if entries and lane.steps == 0 and entries[0].held is not None:
            # its first window: did its first backward find a gradient already there?
            w.began_on_grad = bool(entries[0].held & mine)
        first = entries[0].serial if entries else serial
        inside = sum(1 for z in zeros if z.serial > first) if entries else 0
        w.zero_grads = w.zero_between = inside
        # what the shared window counted, at this window's positions
        base = serial - len(shared.backwards)
        serials = [e.serial for e in entries]

        def at(pos: int) -> int:
            return sum(1 for s in serials if s < base + pos)

        w.clip_micros = [at(c) for c in shared.clip_micros]
        w.clip_names = list(shared.clip_names)
        w.clip_empty = [[at(c), t] for c, t in shared.clip_empty]
        w.clip_unset = [(at(c), ps) for c, ps in shared.clip_unset]
        w.data_passes = [at(d) for d in shared.data_passes]
        w.sched = shared.sched
        w.reductions_between = shared.reductions_between
        w.forwards = shared.forwards
        w.engine_step_calls = shared.engine_step_calls
        w.bw_since_engine_step = shared.bw_since_engine_step
        w.engine_bw_since_step = shared.engine_bw_since_step
        w.max_bw_per_engine_step = shared.max_bw_per_engine_step
        # a GradScaler's unscale_ and a clip of still-scaled gradients (the window's, shared)
        w.unscaled, w.norm_clip = shared.unscaled, shared.norm_clip
        w.scaled_clip, w.scaler = shared.scaled_clip, shared.scaler
        return w


def lane_scales(own: StepTally, shared: StepTally, losses: list[list[Any]] | None,
                terms: list[list[Any]] | None, done: int) -> list[list[list[Any]]] | None:
    """The constants above each loss of an optimizer's own window, when its backwards are
    some of the shared window's (a critic stepped after each of its backwards while the
    actor accumulates): the loss record numbers backwards by their place in the shared
    window, so a record belongs to this optimizer when its place is one of its backwards'.
    None unless the record covered exactly the shared window (``done``) and each of the
    optimizer's backwards has exactly one loss (a recorded call or one mean built by hand)."""
    if done != len(shared.backwards) or not own.backwards:
        return None
    places = [i for i, ev in enumerate(shared.backwards) if any(ev is o for o in own.backwards)]
    if len(places) != len(own.backwards):
        return None
    out: list[list[list[Any]]] = []
    for i in places:
        found = [list(r[9] or []) for r in losses or [] if len(r) > 9 and int(r[2]) == i]
        found += [list(r[5]) for r in terms or [] if r and r[0] == "mean" and len(r) > 5
                  and int(r[1]) == i]
        if len(found) != 1:
            return None
        out.append(found[0])
    return out
