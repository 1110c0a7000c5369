"""DeepSpeed ZeRO-2, K = 2, a checkpoint saved every 5 micro-batches, the run stopped after
the first one and reloaded into a new engine (blind round 100 b_b01, 2 gloo ranks): the
rebuilt engine's first window holds 1 backward. A DeepSpeed checkpoint holds no partly
accumulated gradient (the engine keeps it in its own buffers), so that window lost the saved
half: F13 at error (a warning before, "whether .grad held a gradient was not measured",
which cannot be read on DeepSpeed's buffers and need not be). Its twin, saving only at a
window boundary, is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_a_deepspeed_resume_in_the_middle_of_a_window_is_f13_at_error() -> None:
    errors = [f for f in judge_recorded("r100_ds_resume_mid_window") if f.severity == "error"]
    assert {f.cls for f in errors} == {"F13"}, errors
    assert "DeepSpeed checkpoint holds no partly accumulated gradient" in errors[0].evidence


def test_a_deepspeed_resume_at_a_window_boundary_is_silent() -> None:
    assert [f for f in judge_recorded("r100_ds_resume_at_boundary")
            if f.severity in ("error", "warning")] == []
