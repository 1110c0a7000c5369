"""A loss term normalised per micro-step by its count over the ranks (blind round 97 c_b03):
a DETR-style detector sums its L1 box loss, divides it by the micro-batch's box count
averaged over the ranks (DETR's ``num_boxes``), then by K, beside a classification term.
The F5 pattern over the ranks (each micro-step's elements weigh one total whatever their
count) was judged only when the loss call was the whole loss; the weight a term's call
receives is that term's, whatever the other terms add, so the term is judged too: F5 naming
it. The twin (boxes counted over the window) is silent. On the runs' recordings (2 gloo
ranks, five steps)."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_box_term_counted_per_micro_step_is_f5() -> None:
    errors = [f for f in judge_recorded("r97_detr_boxes_per_micro_step") if f.severity == "error"]
    assert [f.cls for f in errors] == ["F5"], errors
    assert "loss term there" in errors[0].evidence
    assert "uneven element counts" in errors[0].title


def test_box_term_counted_per_window_is_silent() -> None:
    findings = judge_recorded("r97_detr_boxes_per_window")
    assert not [f for f in findings if f.severity == "error"], findings
