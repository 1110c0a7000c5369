"""Accelerate, K = 4, 10 micro-batches per pass, each loss scaled by K / (the window's size
the script expects: 2 for a pass's last two) (blind round 100 a_b03, 2 gloo ranks): a
mid-epoch evaluation breaks out of a prepared DataLoader, Accelerate then tests that loader's
end, not the training loader's, and never steps at a pass's end. The window spanning two
passes weighs its first two micro-batches 2x the others (the loss record): F7 at error
(silent before: every window held K). The twin, whose evaluation loader runs to its end,
steps at each pass's end and is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_a_tail_scaled_as_short_but_carried_into_the_next_pass_is_f7() -> None:
    errors = [f for f in judge_recorded("r100_accelerate_tail_carried_past_pass_end")
              if f.severity == "error"]
    assert sorted((f.cls, f.rank) for f in errors) == [("F7", 0), ("F7", 1)], errors
    assert "each of the first 2 weighed 2x each of the others" in errors[0].evidence


def test_a_tail_stepped_at_the_pass_end_is_silent() -> None:
    assert [f for f in judge_recorded("r100_accelerate_tail_stepped_at_pass_end")
            if f.severity in ("error", "warning")] == []
