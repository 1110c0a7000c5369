"""An Accelerate resume whose skip arithmetic assumes windows run on across epochs
(``run_clm_no_trainer``'s ``resume_step = updates x K``) on epochs whose windows restart
(10 micro-batches, K = 4: 4-4-2), recorded on 2 gloo ranks (blind round 110 a_b01): the
resumed epoch's first window holds two micro-batches normalised as a window of 4 and two
that Accelerate, near the pass's end, divided as a window of 2. The HF model's loss carries a
``/ K`` its caller undoes with ``* K`` before Accelerate's own division, so the record's
constants mix divisions and a multiplication: they are still constants, and the window each
was normalised for is read from the weights. F13; the twin that counts the resume position
in updates per epoch has no error."""

from __future__ import annotations

from accumguard.observe._divisor_rules import _implied_window

from helpers import judge_recorded


def test_resumed_window_normalised_for_two_window_sizes_is_f13() -> None:
    found = [f for f in judge_recorded("r110_accelerate_resume_skips_into_the_tail")
             if f.severity.value == "error"]
    assert [(f.cls, f.rank, f.step) for f in found] == [("F13", 0, 6), ("F13", 1, 6)], found
    assert "as one of a window of 4" in found[0].evidence
    assert "as one of a window of 2" in found[0].evidence


def test_the_twin_resumed_by_updates_per_epoch_has_no_error() -> None:
    found = [f for f in judge_recorded("r110_accelerate_resume_by_updates_per_epoch")
             if f.severity.value == "error"]
    assert found == [], found


def test_a_record_scaled_by_a_coefficient_only_implies_no_window() -> None:
    rec = ["x.py:1", 0, 0, 16, 1 / 32, False, "mean", True, False, [["*", 0.5]], "tokens", 16]
    assert _implied_window(rec) is None
    rec[9] = [["/", 4.0], ["/", 2.0], ["*", 4.0]]
    assert _implied_window(rec) == 2
