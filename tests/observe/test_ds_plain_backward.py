"""A plain ``.backward()`` of a penalty beside DeepSpeed's ``engine.backward`` (blind round
104 b_b01, ZeRO-0, gradient_accumulation_steps 4): DeepSpeed divides only the loss it is
given by K, so the penalty's gradient enters each micro-step undivided (LOSS_SCALE, K x its
coefficient). Before, the two backwards per micro-step read as a loop of 2 backwards around
each engine.step() (a false F14, "double gating"), then as windows 4 micro-steps late (a
false F13): DeepSpeed's micro-steps are its engine.backward calls. The twin hands the
penalty to engine.backward with the loss. Recorded on 2 gloo ranks."""

from __future__ import annotations

from typing import Any

from tests.helpers import judge_recorded


def _errors(name: str) -> list[Any]:
    return [f for f in judge_recorded(name) if f.severity == "error"]


def test_a_penalty_backpropagated_beside_engine_backward_is_loss_scale() -> None:
    errors = _errors("r104_ds_penalty_plain_backward")
    assert {f.cls for f in errors} == {"LOSS_SCALE"}, errors
    assert "outside engine.backward" in errors[0].title
    assert "gradient_accumulation_steps = 4" in errors[0].evidence


def test_the_penalty_inside_engine_backward_is_silent() -> None:
    assert _errors("r104_ds_penalty_in_engine_backward") == []
