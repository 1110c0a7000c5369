"""Ranks that never reduce a gradient: the averaging over ranks is missing, F10 by the
mission's taxonomy (F11 is a sync flag wrong for a micro-step, and no flag is involved).
Blind round 93 b_b01: a ZeRO-0 engine with GA 4 in its config runs every backward, but the
trainer steps the client optimizer itself and never calls ``engine.step()``: the engine's
micro-step counter (advanced there) never reaches a boundary, so it never reduces, and each
rank steps its own gradient. On the run's recording (2 gloo ranks, the first five steps) the
error is F10 naming ``engine.step()``; the twin that calls ``engine.step()`` is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_deepspeed_engine_step_never_called_is_f10() -> None:
    errors = [f for f in judge_recorded("r93_deepspeed_engine_step_never_called")
              if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "engine.step() is never called" in errors[0].title
    assert "never reached an accumulation boundary" in errors[0].evidence
    assert "Call engine.step() after every engine.backward" in errors[0].fix


def test_deepspeed_engine_stepping_is_silent() -> None:
    findings = judge_recorded("r93_deepspeed_engine_steps")
    assert not [f for f in findings if f.severity == "error"], findings
