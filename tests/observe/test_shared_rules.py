"""The decisions the guard and ``watch`` share (``observe/_shared_rules.py``): each one on
its own, and both entry points on the same windows, in process (no torch run needed: the
guard's state machine takes the events, the rules take the window's record)."""

from __future__ import annotations

import itertools
import warnings

import pytest

from accumguard.core.findings import Severity
from accumguard.core.window import Conservation, StepRecord
from accumguard.observe._comm_rules import collectives_before as _collectives_before
from accumguard.observe._records import KResolution
from accumguard.observe._shared_rules import (
    clip_verdict,
    conservation_class,
    double_gating,
    early_step,
    engine_resets,
    long_window_class,
    micro_sync,
    overrun,
    scheduler_ahead,
)
from accumguard.observe._size_rules import _f1
from accumguard.observe._step_rules import _sync_findings
from accumguard.observe.rules import (
    _rank_findings,
    live_findings,
    windows,
)
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
    assert double_gating(4, 2, 8) and not double_gating(4, 1, 8) and not double_gating(1, 4, 8)
    assert not double_gating(None, 4, 8)
    # K backwards then K engine.step() calls (blind round 99 b_b01_fixed): the engine stepped
    # after its own K backwards, no second gate
    assert not double_gating(4, 4, 4)


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
    # a clear that is not a zero_grad (p.grad = None) in a torch loop, where no engine
    # resets: F3 for both (watch said F2/F3 until blind round 97)
    ("wiped", False, "F3", "F3"),
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


@pytest.mark.parametrize(("engine", "after", "zero_between", "cls"), [
    # blind round 48, b_b01: no wrapper, the script all-reduced the accumulated .grad with
    # SUM after every micro-step (divided by W once at the end): backward 2 began right
    # after the script's own collective (the ledger), F10, not an engine reset
    ("local", {1}, False, "F10"),
    ("local", set(), False, "F3"),  # no collective before the changed backward: a clear
    ("local", {1}, True, "F3"),  # a zero_grad between the backwards says what cleared it
    ("ddp", {1}, False, "F3"),  # DDP's own collectives are not the script's
])
def test_a_hand_reduction_inside_the_window_is_f10_not_a_clear(
        engine: str, after: set[int], zero_between: bool, cls: str) -> None:
    cons = Conservation(params=1, wiped=0.4, stale=0.0, received=0.9, ok=False, reason="wiped",
                        first_wipe=1, wipes=(1,))
    record = StepRecord(step=0, backwards=2, engine=engine, zero_grads=int(zero_between),
                        zero_grads_between=int(zero_between), conservation=cons)
    found = _rank_findings(0, [StepRecord.from_dict(record.as_dict(rank=0))], {}, 2, True,
                           {0: after})
    assert {f.cls for f in found if f.severity == "error"} == {cls}


def test_the_ledger_positions_reach_every_optimizer_of_the_shared_window() -> None:
    """Two optimizers stepping at one boundary: the ledger's rows are on the first one's
    record (a SUM after backward 1, then the final one after backward 2); both steps learn
    that backward 2 (index 1) began after the script's collective. A DDP window: nothing."""
    rows = [["all_reduce", 1, False, 1, 9108, 0.001], ["all_reduce", 2, False, 1, 9108, 0.001]]
    lines = [{"step": 0, "backwards": 2, "engine": "local", "comm": {"rows": rows}},
             {"step": 1, "backwards": 2, "engine": "local", "comm": {"rows": []}},
             {"step": 2, "backwards": 2, "engine": "local", "comm": None},
             {"step": 3, "backwards": 2, "engine": "ddp", "comm": {"rows": rows}}]
    got = _collectives_before(lines)
    assert 1 in got[0] and got[1] == got[0] == got[2] and 3 not in got


def test_clip_verdict() -> None:
    assert clip_verdict(0, 4) == "outside"  # before the window's first backward
    assert clip_verdict(1, 4) == "inside" and clip_verdict(3, 4) == "inside"
    assert clip_verdict(4, 4) is None  # at the boundary: where clipping belongs
    assert clip_verdict(1, 1) is None  # a window an early step cut short: F1's, not F8's


def test_early_step_overrun_and_long_window_class() -> None:
    assert early_step(1, 4) and early_step(3, 4)
    assert not early_step(0, 4) and not early_step(4, 4) and not early_step(5, 4)
    assert not early_step(1, 4, [4])  # K forwards summed before one backward: the large batch
    assert early_step(1, 4, [3]) and early_step(2, 4, [4, 4])
    assert overrun(4, 4) and not overrun(3, 4)
    assert long_window_class(True) == "F7" and long_window_class(False) == "F13"


def _guarded(k: int, events: list[str]) -> GuardMachine:
    """The guard's state machine fed ``events`` ("b" backward, "c" clip, "s" step,
    "z" zero_grad), then closed."""
    g = _guard(k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for e in events:
            if e == "b":
                g.backward()
            elif e == "c":
                g.clip(scaler_enabled=False)
            elif e == "s":
                g.step()
            else:
                g.zero_grad()
        g.final_checks()
    return g


@pytest.mark.parametrize("at", range(K + 1))
def test_guard_and_watch_judge_every_clip_place_alike(at: int) -> None:
    """A clip after ``at`` of the window's K backward passes: F8 from both when it is
    inside the window (a later backward adds to the clipped sum), nothing at the boundary,
    and before the window's first backward a note (it clips none of this window's
    gradient): the guard's note carries an F8 finding at note level, ``watch`` stays silent
    at error level (it was F8 there before the rule was shared)."""
    events = ["c" if j == at else "" for j in range(K)]
    seq = [e for j in range(K) for e in (events[j], "b") if e] + (["c"] if at == K else [])
    g = _guarded(K, [*seq, "s", "z"])
    by_guard = {v.rule for v in g.violations}
    record = StepRecord(step=0, backwards=K, clip_micros=[at],
                        clip_functions=["clip_grad_norm_"]).as_dict(rank=0)
    by_watch = {f.cls for f in _rank_findings(0, [record], {}, K, True)
                if f.severity == "error"}
    assert by_guard == by_watch == ({"F8"} if 0 < at < K else set())
    notes = [n for n in g.notes if n.kind == "note_clip_outside"]
    assert bool(notes) == (at == 0)
    for n in notes:
        assert n.finding is not None and n.finding.cls == "F8"
        assert n.finding.severity is Severity.NOTE


def test_a_clip_after_the_step_is_a_note_for_both() -> None:
    """Clipping after optimizer.step() (before zero_grad): the guard sees it with the
    window stepped, ``watch`` records it before the next window's first backward (0)."""
    g = _guarded(K, [*"b" * K, "s", "c", "z", *"b" * K, "s", "z"])
    assert not g.violations and [n.kind for n in g.notes] == ["note_clip_outside"]
    records = [StepRecord(step=0, backwards=K).as_dict(rank=0),
               StepRecord(step=1, backwards=K, clip_micros=[0]).as_dict(rank=0)]
    assert not [f for f in _rank_findings(0, records, {}, K, True) if f.severity == "error"]


@pytest.mark.parametrize("summed", [False, True])
def test_guard_and_watch_judge_a_step_per_backward_alike(summed: bool) -> None:
    """A step after every backward with K declared: F1 from both; unless each backward came
    after K forwards (the window's losses summed before one backward: the large batch),
    then neither."""
    g = _guard(K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            g.backward(forwards=K if summed else 1)
            g.step()
            g.zero_grad()
        g.final_checks()
    by_guard = {v.rule for v in g.violations}
    recorded = windows([StepRecord(step=i, backwards=1, forwards=[K if summed else 1])
                        for i in range(3)])
    res = KResolution(K, "--accumulation-steps", "flag", None)
    by_watch = {f.cls for f in _f1(0, recorded, res) if f.severity == "error"}
    assert by_guard == by_watch == (set() if summed else {"F1"})


def test_guard_and_live_rules_judge_a_long_window_alike() -> None:
    """K + 1 backward passes before one step: F13 from the guard (at the extra backward)
    and from the per-window rules of the callbacks (over the finished window)."""
    g = _guarded(K, [*"b" * (K + 1), "s", "z"])
    assert {v.rule for v in g.violations} == {"F13"}
    record = StepRecord(step=0, backwards=K + 1).as_dict(rank=0)
    assert {f.cls for f in live_findings(record, rank=0, k=K)
            if f.severity == "error"} == {"F13"}


def test_every_guard_note_carries_a_finding() -> None:
    """A clip before the window and an all-reduce on every micro-step: two notes, each with
    its finding (F8 and EXTRA_SYNC, note level, numbered from 1 as violations are)."""
    g = _guard(K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g.clip(scaler_enabled=False)
        for _ in range(K):
            g.backward(sync_forward=True, sync_backward=True, ddp=True)
        g.step()
        g.final_checks()
    assert not g.violations
    found = {n.kind: n.finding for n in g.notes}
    assert set(found) == {"note_clip_outside", "note_extra_sync"}
    assert found["note_clip_outside"] is not None and found["note_clip_outside"].cls == "F8"
    extra = found["note_extra_sync"]
    assert extra is not None and extra.cls == "EXTRA_SYNC" and extra.step == 1
    assert all(f is not None and f.severity is Severity.NOTE for f in found.values())


def test_a_stale_start_is_titled_as_an_uncleared_gradient() -> None:
    """The class's own title lists partial-window causes; a gradient left from the previous
    step (blind round 72 c_b01: one optimizer's parameters never cleared) says that."""
    cons = Conservation(params=1, wiped=0.0, stale=0.5, received=0.5, ok=False, reason="stale")
    record = StepRecord(step=0, backwards=K, conservation=cons)
    found = _rank_findings(0, [StepRecord.from_dict(record.as_dict(rank=0))], {}, K, True)
    (f,) = [f for f in found if f.severity == "error"]
    assert f.cls == "F7" and f.title.startswith("gradient not cleared after an optimizer step")
    assert "zero_grad() on each optimizer" in f.fix
