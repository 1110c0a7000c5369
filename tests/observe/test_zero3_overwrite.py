"""Blind round 126 a_b01, recorded on 2 gloo ranks: a ZeRO-3 dual encoder (GA 4 in the
config) running its towers through ``engine.module.encode(...)``, never through the engine's
forward. DeepSpeed 0.19 advances ZeRO-3's ``micro_step_id`` in that forward and copies a
backward's gradient over the window's at id 0: each window kept its last micro-batch only.
The run said nothing; the ids the observer reads at each ``engine.backward`` (0, 0, 0, 0
against the twin's 0, 1, 2, 3) prove it: F3 at error."""

from __future__ import annotations

from accumguard.observe.rules import analyze
from accumguard.watch._findings import load_recordings
from tests.helpers import RECORDED, judge_recorded


def test_backwards_at_one_micro_step_id_are_f3() -> None:
    errors = [f for f in judge_recorded("r126_ds_zero3_forward_past_engine") if f.severity == "error"]
    assert {f.cls for f in errors} == {"F3"}, errors
    assert "both ran at the optimizer's micro_step_id 0" in errors[0].evidence
    assert "(8 of 8 windows)" in errors[0].evidence


def test_the_twin_through_the_engine_is_silent() -> None:
    found = judge_recorded("r126_ds_zero3_forward_through_engine")
    assert [f for f in found if f.severity in ("error", "warning")] == [], found


def test_other_zero_stages_are_not_judged() -> None:
    """ZeRO-1/2 advance their id in the backward itself: the rule reads stage 3 only."""
    rec = load_recordings(RECORDED / "r126_ds_zero3_forward_past_engine")
    for info in rec.engine.values():
        info["zero_stage"] = 2
    found, _, _ = analyze(rec)
    assert not any(f.cls == "F3" for f in found), found


def test_backwards_inside_a_coalesced_block_are_not_judged() -> None:
    """Inside ``engine.coalesce_grad_reduction()`` (accumguard's own deferred mode, caught by
    the guard/watch catalogue's ZeRO-3 accumulator loop) the id stays put by design."""
    rec = load_recordings(RECORDED / "r126_ds_zero3_forward_past_engine")
    for lines in rec.steps.values():
        for step in lines:
            step["ds_coalescing"] = [True] * len(step.get("ds_micro_ids") or [])
    found, _, _ = analyze(rec)
    assert not any(f.cls == "F3" for f in found), found
