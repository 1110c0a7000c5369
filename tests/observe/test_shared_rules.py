"""The decisions the guard and ``watch`` share (``observe/_shared_rules.py``): each one on
its own, and both entry points on the same windows, in process (no torch run needed: the
guard's state machine takes the events, the rules take the window's record)."""

from __future__ import annotations

import itertools
import warnings

import pytest

from accumguard.core.window import Conservation, StepRecord
from accumguard.observe._shared_rules import (
    conservation_class,
    double_gating,
    engine_resets,
    micro_sync,
    scheduler_ahead,
)
from accumguard.observe._step_rules import _sync_findings
from accumguard.observe.rules import _rank_findings
from accumguard.runtime._guard_machine import GuardMachine


def test_micro_sync() -> None:
    assert micro_sync(False, last=True) == "unsynced_last"
    assert micro_sync(True, last=True) is None
    assert micro_sync(True, last=False) == "extra"
    assert micro_sync(False, last=False) == "deferred"
    assert micro_sync(None, last=True) is None and micro_sync(None, last=False) is None


def test_engine_resets_and_double_gating() -> None:
    assert engine_resets(2, True, True, False) and engine_resets(1, True, True, False)
    assert not engine_resets(3, True, True, False)  # ZeRO-3 keeps its partitions
    assert not engine_resets(2, False, True, False)  # the loop drives the boundary itself
    assert not engine_resets(2, None, True, False)
    assert not engine_resets(2, True, False, False)
    assert not engine_resets(2, True, True, True)  # inside coalesce_grad_reduction
    assert double_gating(4, 2) and not double_gating(4, 1) and not double_gating(1, 4)
    assert not double_gating(None, 4)


def test_scheduler_ahead() -> None:
    assert scheduler_ahead(2, 1, allowance=0) and not scheduler_ahead(2, 1, allowance=1)
    assert not scheduler_ahead(1, 1, allowance=0) and scheduler_ahead(3, 1, allowance=1)


def test_conservation_class() -> None:
    assert conservation_class("stale", zero_grad_inside=True) == "F7"
    assert conservation_class("wiped", zero_grad_inside=True) == "F3"
    assert conservation_class("wiped", zero_grad_inside=False) == "F2/F3"


def _guard(k: int, sync: str = "deferred") -> GuardMachine:
    return GuardMachine(accumulation_steps=k, mode="warn", sync=sync, total_micro_batches=None,
                        history=8, rank=None)


K = 3


@pytest.mark.parametrize("syncs", list(itertools.product([True, False], repeat=K)))
def test_guard_and_watch_judge_every_sync_pattern_alike(syncs: tuple[bool, ...]) -> None:
    """Every pattern of DDP sync flags over a window of K: F11 from both or neither, and a
    wasteful-sync note from both or neither."""
    g = _guard(K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in syncs:
            g.backward(sync_forward=s, sync_backward=s, ddp=True)
        g.step()
        g.final_checks()  # closes the window
    by_guard = {v.rule for v in g.violations}
    record = StepRecord(step=0, backwards=K, engine="ddp", sync_micros=list(syncs),
                        sync_backward=list(syncs)).as_dict(rank=0)
    by_watch = _sync_findings(0, StepRecord.from_dict(record))
    assert by_guard == {f.cls for f in by_watch if f.severity == "error"}
    assert (by_guard == {"F11"}) == (syncs[-1] is False)
    extra = any(syncs[:-1])
    assert any(n.kind == "note_extra_sync" for n in g.notes) == extra
    if syncs[-1]:  # (after F11, watch names the micro-steps that synced in its evidence)
        assert any(f.cls == "EXTRA_SYNC" for f in by_watch) == extra
    else:
        assert extra == ("synchronised instead" in by_watch[0].evidence)
    # the guard's closed window holds the same flags the recording does
    assert g.windows[-1].sync_micros == list(syncs)
    assert g.windows[-1].sync_rounds == sum(syncs)


@pytest.mark.parametrize(("reason", "zero_between", "guard_cls", "watch_cls"), [
    ("stale", False, "F7", "F7"),
    ("wiped", True, "F3", "F3"),
    # a clear that is not a zero_grad (p.grad = None): watch cannot tell it from an engine
    # reset (F2/F3); the guard raises its F3 exception, which says the gradients were cleared
    ("wiped", False, "F3", "F2/F3"),
])
def test_guard_and_watch_class_a_broken_conservation_alike(
        reason: str, zero_between: bool, guard_cls: str, watch_cls: str) -> None:
    cons = Conservation(params=1, wiped=0.5 if reason == "wiped" else 0.0,
                        stale=0.5 if reason == "stale" else 0.0, received=0.5, ok=False,
                        reason=reason, first_wipe=1 if reason == "wiped" else None,
                        wipes=(1,) if reason == "wiped" else ())
    g = _guard(K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for j in range(K):
            if zero_between and j == 1:
                g.zero_grad()
            g.backward()
        g.step(conservation=cons)
    assert {v.rule for v in g.violations} == {guard_cls}
    record = StepRecord(step=0, backwards=K, zero_grads=int(zero_between),
                        zero_grads_between=int(zero_between), conservation=cons)
    found = _rank_findings(0, [StepRecord.from_dict(record.as_dict(rank=0))], {}, K, True)
    assert {f.cls for f in found if f.severity == "error"} == {watch_cls}
