"""The observer's typed listener interface (:class:`accumguard.observe._events.Handlers`):
every listener method accumguard's own listeners define is an event kind the observer
dispatches (a misspelt ``on_*`` would silently never be called), a listener gets exactly the
kinds it implements, and the events of a tiny loop carry the typed owners the fields say."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from accumguard.integrations.lightning import _RescaleBeforeClip
from accumguard.observe._comm_ledger import CommLedger
from accumguard.observe._events import (
    BackwardEvent,
    ClipEvent,
    Handlers,
    SchedulerEvent,
    StepEvent,
    StepStartEvent,
    ZeroGradEvent,
)
from accumguard.observe._observer import Observer
from accumguard.runtime.guard import AccumulationGuard
from accumguard.verify._observer import Observer as AuditObserver
from accumguard.watch._recording import _Agent

KINDS = {f.name for f in dataclasses.fields(Handlers)}
# listener classes whose on_* methods are observer events (not framework callbacks)
LISTENERS = [AccumulationGuard, AuditObserver, _Agent, CommLedger, _RescaleBeforeClip]


@pytest.mark.parametrize("cls", LISTENERS, ids=lambda c: c.__name__)
def test_listener_methods_are_event_kinds(cls: type) -> None:
    methods = {name for name, _ in inspect.getmembers(cls, inspect.isfunction)
               if name.startswith("on_")}
    assert methods, f"{cls.__name__} implements no event"
    assert methods <= KINDS, f"{cls.__name__}: not event kinds: {sorted(methods - KINDS)}"


def test_checks_listener_methods_are_event_kinds() -> None:
    from accumguard.integrations._checks import AccumulationChecks

    methods = {n for n, _ in inspect.getmembers(AccumulationChecks, inspect.isfunction)
               if n.startswith("on_")}
    assert methods and methods <= KINDS, sorted(methods - KINDS)


class _Partial:
    """Implements three kinds, each typed by its event."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def on_step(self, ev: StepEvent) -> None:
        self.seen.append(ev)

    def on_clip(self, ev: ClipEvent) -> None:
        self.seen.append(ev)

    def on_zero_grad(self, ev: ZeroGradEvent) -> None:
        self.seen.append(ev)


def test_handlers_hold_exactly_the_kinds_a_listener_implements() -> None:
    listener = _Partial()
    h = Handlers.of([listener])
    have = {k for k in KINDS if getattr(h, k)}
    assert have == {"on_step", "on_clip", "on_zero_grad"}
    assert h["on_step"] == [listener.on_step]  # the by-name read (_losses uses it)
    assert not h["on_backward"]


class _Typed:
    def __init__(self) -> None:
        self.kinds: dict[str, list[object]] = {}

    def _add(self, kind: str, ev: object) -> None:
        self.kinds.setdefault(kind, []).append(ev)

    def on_backward(self, ev: BackwardEvent) -> None:
        self._add("backward", ev)

    def on_step_start(self, ev: StepStartEvent) -> None:
        self._add("step_start", ev)

    def on_step(self, ev: StepEvent) -> None:
        self._add("step", ev)

    def on_zero_grad(self, ev: ZeroGradEvent) -> None:
        self._add("zero_grad", ev)

    def on_scheduler_step(self, ev: SchedulerEvent) -> None:
        self._add("scheduler", ev)

    def on_clip(self, ev: ClipEvent) -> None:
        self._add("clip", ev)


def test_a_loop_delivers_typed_events_to_each_method() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    listener = _Typed()
    obs = Observer(roots=[model])
    obs.add_listener(listener)
    with obs:
        for _ in range(2):
            for _ in range(2):
                model(torch.randn(3, 4)).pow(2).sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
    k = listener.kinds
    assert [type(e) for e in k["backward"]] == [BackwardEvent] * 4
    assert len(k["step"]) == 2 and all(isinstance(e, StepEvent) for e in k["step"])
    assert all(e.owner is opt for e in k["step_start"])
    assert all(e.owner is opt and e.kind == "optimizer"
               for e in k["zero_grad"])
    assert all(e.owner is sched for e in k["scheduler"])
    clip = k["clip"][0]
    assert isinstance(clip, ClipEvent)
    assert all(isinstance(p, torch.Tensor) for p in clip.params) and len(clip.params) == 2
