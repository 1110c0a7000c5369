"""A DeepSpeed engine that never stepped (blind round 125 a_b02, recorded on 2 gloo ranks):
ZeRO-2 with ``gradient_accumulation_steps`` 4 in the config, the script calling
``engine.step()`` only when ``engine.is_gradient_accumulation_boundary()`` is true. DeepSpeed
counts its micro-steps inside ``engine.step()``, so the boundary never came: 40
``engine.backward()`` calls per rank and no optimizer step. The report said only that
nothing was checked; it is F14 (the step gated twice) at error now."""

from __future__ import annotations

from accumguard.observe.rules import analyze
from accumguard.watch._findings import load_recordings
from tests.helpers import RECORDED, judge_recorded

NAME = "r125_ds_step_only_at_boundary_never_steps"


def test_an_engine_never_stepped_is_f14() -> None:
    errors = [f for f in judge_recorded(NAME) if f.severity == "error"]
    assert {f.cls for f in errors} == {"F14"}, errors
    assert "40 backward passes through engine.backward() and not one engine.step()" \
        in errors[0].evidence
    assert "gradient_accumulation_steps = 4" in errors[0].evidence


def test_not_claimed_below_two_windows_or_after_a_step_call() -> None:
    """Fewer engine.backward() calls than two windows (a run stopped early), or an
    engine.step() call in the open window: no claim."""
    for change in ({"engine_backwards_pending": 7}, {"engine_step_calls_pending": 1},
                   {"engine_backwards_pending": None}):
        rec = load_recordings(RECORDED / NAME)
        for end in rec.end.values():
            end.update(change)
        found, _, _ = analyze(rec)
        assert not any(f.cls == "F14" for f in found), (change, found)


def test_not_claimed_without_a_deepspeed_accumulation() -> None:
    rec = load_recordings(RECORDED / NAME)
    for info in rec.engine.values():
        info["gradient_accumulation_steps"] = 1
    found, _, _ = analyze(rec)
    assert not any(f.cls == "F14" for f in found), found
