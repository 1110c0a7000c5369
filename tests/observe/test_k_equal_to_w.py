"""K equal to W (blind round 104 a_b02, K = W = 2): Accelerate, the loss a token sum times
``num_processes`` over the window's all-ranks count, then ``accelerator.backward`` divides it
by K again. The total weight 1/2 is 1/W and 1/K at once; it was called F10 ("the loss was
divided by a count common to all ranks and DDP averaged again"), which the x W in the loss
contradicts. With a multiplication by W and a division by K both in every micro-step's
constants, the total is the division by K: LOSS_SCALE. The twin (times K as well) is
silent. Recorded on 2 gloo ranks."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_a_window_count_times_w_divided_by_k_again_is_loss_scale() -> None:
    errors = [f for f in judge_recorded("r104_accelerate_window_count_divided_by_k")
              if f.severity == "error"]
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    assert "K = 2 times too small" in errors[0].title
    assert "Accelerate: loss_sum * accelerator.num_processes" in errors[0].fix


def test_the_window_count_times_w_and_k_is_silent() -> None:
    assert [f for f in judge_recorded("r104_accelerate_window_count_times_k")
            if f.severity == "error"] == []
