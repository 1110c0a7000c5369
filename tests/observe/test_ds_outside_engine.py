"""Parameters outside DeepSpeed's engine (blind round 105 b_b01, ZeRO-0, GA 4): learned task
weights (``log_vars``) live in a loss module that the client optimizer steps but the model
handed to ``deepspeed.initialize`` does not hold. ZeRO-0 averages the engine's module's
gradients only, so the ranks' optimizers receive different gradients: F10 naming them (it
was the generic F11, "ranks train different models"). The twin all-reduces their gradients
by hand before ``engine.step()``: silent. Recorded on 2 gloo ranks."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_weights_outside_a_zero0_engine_are_f10() -> None:
    errors = [f for f in judge_recorded("r105_ds_zero0_weights_outside_engine")
              if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "log_vars" in errors[0].evidence
    assert "deepspeed.initialize" in errors[0].fix


def test_the_same_weights_averaged_by_hand_are_silent() -> None:
    assert [f for f in judge_recorded("r105_ds_zero0_weights_outside_engine_averaged")
            if f.severity == "error"] == []


def test_an_own_optimizer_beside_a_zero2_engine_steps_what_no_rank_averaged() -> None:
    """Blind round 122 a_b01: ZeRO-2, the same learned task weights stepped by the script's
    own SGD at each boundary (not the engine's optimizer, so no ZeRO partition covers them):
    their ``.grad`` read after the step differs across ranks, F10 naming them. The twin
    averages them by hand before its step: silent."""
    errors = [f for f in judge_recorded("r122_ds_zero2_own_optimizer_never_averaged")
              if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "log_vars" in errors[0].evidence and "every ZeRO stage" in errors[0].evidence
    assert [f for f in judge_recorded("r122_ds_zero2_own_optimizer_averaged")
            if f.severity == "error"] == []
