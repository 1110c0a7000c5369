"""A loss built by hand as each micro-batch's token mean, handed to the stock HF Trainer as
``compute_loss_func`` (blind round 118 b_b03; 2 DDP ranks, K = 2, uneven token counts). The
Trainer trusts such a function to divide by ``num_items_in_batch``: it skips its own / K and
multiplies by the processes to undo DDP's average, so the means weigh K x W = 4 in total
where the large batch's mean weighs 1. The report said F5 ("means / K", a division that never
happened); it is a LOSS_SCALE error naming the factor. The twin dividing the token sum by
``num_items_in_batch`` has no finding."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_trainer_scaled_token_means_are_loss_scale_k_times_w() -> None:
    findings = judge_recorded("r118_hf_compute_loss_func_token_mean")
    errors = [f for f in findings if f.severity == "error"]
    assert [f.cls for f in errors] == ["LOSS_SCALE"], findings
    assert "4x (K x W)" in errors[0].title
    assert "37 / 41 elements" in errors[0].evidence and "divided by 0.5" in errors[0].evidence


def test_token_sum_over_num_items_has_no_finding() -> None:
    findings = judge_recorded("r118_hf_compute_loss_func_over_num_items")
    assert not [f for f in findings if f.severity in ("error", "warning")], findings


def _window(d: float, factor: float | None) -> dict[str, object]:
    return {"step": 0, "window": 2, "rank_factor": factor,
            "terms": [["mean", 0, d, 30, "x.py:1", []], ["mean", 1, d, 50, "x.py:1", []]]}


def test_the_total_decides_the_class_and_a_chosen_constant_is_not_judged() -> None:
    from accumguard.observe._hand_mean_rules import hand_mean_findings

    def cls(d: float, world: int, factor: float | None) -> list[str]:
        return [f.cls for f in hand_mean_findings(0, [_window(d, factor)], world)]

    assert cls(2.0, 2, 0.5) == ["F5"]  # mean / K, averaged: total 1, only the counts differ
    assert cls(1.0, 2, 0.5) == ["LOSS_SCALE"]  # never divided by K: total K
    assert cls(2.0, 3, 1.0) == ["F10"]  # summed over 3 ranks, not averaged: total W
    assert cls(0.8, 2, 0.5) == ["F5"]  # 2.5: a constant the loop chose, not a scale error
    assert cls(1.0, 2, None) == ["F5"]  # the engine's factor unknown: the scale is not judged
