"""A scheduler stepped once per window but between two of its backwards, before the
window's optimizer step (blind round 89 b_b01: a ZeRO-1 loop asking
``engine.is_gradient_accumulation_boundary()`` after ``engine.step()``, which already counted
the micro-step, so the warm-up LambdaLR steps one micro-step early): each update uses the
rate the schedule gives the next step. F4, an error. The twin reads the flag before
``engine.step()`` and steps the scheduler after the update: silent. The rules run on the
first six steps of the two runs' recordings (2 ranks, DeepSpeed on gloo, ``watch --keep``)."""

from __future__ import annotations

from helpers import judge_recorded


def test_a_scheduler_stepped_between_backwards_is_one_step_ahead() -> None:
    findings = judge_recorded("r89_ds_scheduler_one_micro_step_early")
    errors = [f for f in findings if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"F4"}, findings
    assert "inside the window, before the optimizer step" in errors[0].title
    assert "after 1 of the window's 2 backward passes" in errors[0].evidence


def test_a_scheduler_stepped_after_the_update_is_silent() -> None:
    findings = judge_recorded("r89_ds_scheduler_after_the_step")
    assert not [f for f in findings if f.severity in ("error", "warning")], findings
