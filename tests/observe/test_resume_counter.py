"""A run rebuilt to resume mid-window that restores the saved partial window's gradient but
not its micro-step counter (blind round 89 c_b03: ``micro_step = global_step * K``): the
resumed window runs K more micro-steps on top of the restored ones, so one update holds
K + 2 micro-batches. F13 (the counter), not F7 "gradient not cleared" (the leftover was
restored on purpose). The twin restores the counter: its resumed window runs the 2 missing
micro-steps and is silent. The rules run on the two runs' recordings (2 DDP ranks on gloo,
``watch --keep``)."""

from __future__ import annotations

from helpers import judge_recorded


def test_a_counter_restarted_after_restoring_the_gradient_is_f13() -> None:
    findings = judge_recorded("r89_resume_counter_from_step_count")
    errors = [f for f in findings if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"F13"}, findings
    assert "micro-step counter was not restored" in errors[0].title
    assert "(2 ran before the resume)" in errors[0].evidence


def test_the_counter_restored_is_silent() -> None:
    findings = judge_recorded("r89_resume_counter_restored")
    assert not [f for f in findings if f.severity in ("error", "warning")], findings
