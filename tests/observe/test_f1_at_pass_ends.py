"""Accelerate with a window's batches drawn ahead of ``accumulate()`` (blind round 119 b_c02,
labelled correct by its writer; 2 DDP ranks, K = 3, two passes of two windows): once the
prepared loader has yielded its last batch, every ``accumulate()`` is a sync step, so each
micro-step of a pass's last window steps the optimizer. The F1 says where its single-backward
steps are (at each pass's end) and why Accelerate steps there, so the report explains what
looks like a correct loop."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_steps_at_every_micro_step_of_each_pass_end_are_f1_saying_so() -> None:
    findings = judge_recorded("r119_accelerate_windows_read_ahead")
    errors = [f for f in findings if f.severity == "error"]
    assert {f.cls for f in errors} == {"F1"}, findings
    assert "6 of 8 optimizer steps" in errors[0].evidence
    assert "ends a pass over the DataLoader" in errors[0].evidence
    assert "sync_with_dataloader" in errors[0].evidence
