"""A divisor counted from each micro-batch to the end of the pass (``min(K, n_micro - i)``
at micro-batch i) instead of from the window's start (blind round 98 c_b02, DDP, CTC loss,
10 micro-batches per pass, K = 4): the pass's second window divides its last micro-step by 3
and the 2-micro-step tail by 2 then 1. The loss record's divisors show it; it is F7 (the
windows ending a pass mis-scaled), stated with the divisors and the micro-batches left, not
the off-by-one counter (F13) of a boundary that drifts. The fixed twin (the divisor read at
the window's start) is silent. Recorded on 2 gloo ranks, first 5 steps."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_divisor_counted_to_the_pass_end_is_f7_with_its_divisors() -> None:
    errors = [f for f in judge_recorded("r98_divisor_counted_to_pass_end")
              if f.severity == "error"]
    assert sorted((f.cls, f.rank) for f in errors) == [("F7", 0), ("F7", 1)], errors
    ev = errors[0].evidence
    assert "windows of 4, 4, 4, 3 micro-steps" in ev, ev
    assert "6 from this window's first to the pass's end" in ev, ev
    assert "windows of 2, 1, not 2" in ev, ev
    assert "counter" not in ev


def test_divisor_read_at_the_window_start_is_silent() -> None:
    assert [f for f in judge_recorded("r98_divisor_from_window_start")
            if f.severity == "error"] == []
