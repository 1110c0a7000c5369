"""A resume that restarts inside a window (blind round 117 b_b02): Accelerate with LoRA,
K = 2 on 2 DDP ranks, checkpointed with ``save_state`` after optimizer step 5, resumed into
new objects with ``skip_first_batches`` given the completed optimizer steps (5) instead of
steps x K micro-batches (10). The resumed pass replays micro-batches and ends on a window of
one micro-batch divided by K, while the run's other pass ends fall on full windows: F13
(the resume), not F7 (the short window is its consequence). The twin skipping 10 has no
finding. A fresh optimizer's own state reloaded by ``accelerator.prepare()`` is no resume."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import RECORDED, judge_recorded


def test_resume_skipping_steps_instead_of_micro_batches_is_f13() -> None:
    findings = judge_recorded("r117_accelerate_resume_skips_steps_not_micro_batches")
    errors = [f for f in findings if f.severity == "error"]
    assert {f.cls for f in errors} == {"F13"}, findings
    assert "resumed before optimizer step 6" in errors[0].evidence
    assert "1 of K = 2 micro-steps" in errors[0].evidence
    assert "skip_first_batches" in errors[0].fix


def test_resume_at_a_window_boundary_has_no_finding() -> None:
    findings = judge_recorded("r117_accelerate_resume_skips_micro_batches")
    assert not [f for f in findings if f.severity in ("error", "warning")], findings


def test_a_fresh_optimizers_reload_is_not_recorded_as_a_resume() -> None:
    from accumguard.watch._findings import load_recordings

    rec = load_recordings(Path(RECORDED / "r117_accelerate_resume_skips_steps_not_micro_batches"))
    assert {tuple(e.get("state_loads") or []) for e in rec.end.values()} == {(5,)}
