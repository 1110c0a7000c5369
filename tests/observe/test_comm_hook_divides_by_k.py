"""A DDP communication hook that divides by W x K (blind round 97 b_b03): a custom fp32 hook
divides each bucket by ``world_size * accum_steps`` while the loss is already divided by K,
so every update is K times too small. The hook's factor was measured (bucket sums before
the hook, checksums at the step) but only 1/W and 1 were read: silent. A measured 1/(W K)
beside window-normalised losses is now LOSS_SCALE naming the hook; the twin dividing by W
only is silent. On the runs' recordings (2 gloo ranks, ZeroRedundancyOptimizer, five
steps)."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_hook_dividing_by_w_times_k_is_loss_scale() -> None:
    errors = [f for f in judge_recorded("r97_comm_hook_divides_by_w_k") if f.severity == "error"]
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    assert "communication hook divides by W x K" in errors[0].title
    assert "3x too small" in errors[0].title


def test_hook_dividing_by_w_is_silent() -> None:
    findings = judge_recorded("r97_comm_hook_divides_by_w")
    assert not [f for f in findings if f.severity == "error"], findings
