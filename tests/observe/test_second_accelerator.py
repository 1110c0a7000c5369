"""A second Accelerator() resets K for all (blind round 98 a_b01): a logging helper builds
``Accelerator()`` after the real one was made with ``gradient_accumulation_steps=4``;
Accelerate keeps K in a state every Accelerator shares, so it reads 1 from then on and the
optimizer steps after every micro-batch (24 updates instead of 6). watch read K at each
``accelerator.backward`` (1 by then): no F1, and an F4 "schedule ends 4x early" whose fix
(re-size the horizon) was wrong. K is now also read as each Accelerator is built: F1, and the
horizon finding it explains is left out. The twin (``PartialState()`` in the helper) is
silent. On the runs' recordings (2 gloo ranks, five steps)."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_second_accelerator_is_f1_alone() -> None:
    errors = [f for f in judge_recorded("r98_second_accelerator_resets_k")
              if f.severity == "error"]
    assert {f.cls for f in errors} == {"F1"}, errors
    assert "declared by accelerate" in errors[0].evidence


def test_partial_state_in_the_helper_is_silent() -> None:
    findings = judge_recorded("r98_partial_state_keeps_k")
    assert not [f for f in findings if f.severity == "error"], findings
