"""A backward before training whose gradient reaches the first step (blind round 92 c_b03:
a reward-model trainer's sanity check runs one forward/backward on a probe batch and never
clears it; K = 2, DDP on 2 gloo ranks, the recordings' first five steps). The first window
has 3 backward passes, the probe's at a call site no later window uses: F7 at error level,
where it was a note about windows of varying size. The twin clears the probe's gradient
(its first window is 2): no error."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_probe_backward_not_cleared_is_f7() -> None:
    errors = [f for f in judge_recorded("r92_probe_backward_not_cleared") if f.severity == "error"]
    assert {f.cls for f in errors} == {"F7"}, errors
    f = errors[0]
    assert "c_b03.py:71" in f.title and "before training" in f.title
    assert "optimizer step 1 is not the large batch's" in f.evidence
    assert "zero_grad" in f.fix


def test_probe_backward_cleared_has_no_error() -> None:
    findings = judge_recorded("r92_probe_backward_cleared")
    assert not [f for f in findings if f.severity == "error"], findings
