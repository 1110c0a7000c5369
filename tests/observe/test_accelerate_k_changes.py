"""Blind round 126 b_c02 (correct), recorded on 2 gloo ranks: Accelerate with a batch-size
warm-up, the script setting ``accelerator.gradient_accumulation_steps`` from 2 to 4 at an
epoch boundary (windows built by hand, each over its all-ranks token count, AdamW + SGD).
Judged against the first K alone, the windows of 4 read as "the boundary comes 2 micro-steps
late" (F13 at error). The observer now notes each K the script sets (read at every
``accelerator.backward``), and each window is judged against the K it ran under."""

from __future__ import annotations

from accumguard.observe.rules import analyze
from accumguard.watch._findings import load_recordings
from tests.helpers import RECORDED

NAME = "r126_accelerate_k_warmup_set_by_script"


def test_the_change_is_recorded_with_who_made_it() -> None:
    rec = load_recordings(RECORDED / NAME)
    for end in rec.end.values():
        assert end["k_changes"] == [[0, 2], [16, 4]], end.get("k_changes")
        assert "Accelerator.gradient_accumulation_steps" in end["k_changes_by"]


def test_windows_are_judged_against_the_k_they_ran_under() -> None:
    found, _, _ = analyze(load_recordings(RECORDED / NAME))
    assert [f for f in found if f.severity in ("error", "warning")] == [], found


def test_without_the_changes_the_later_windows_read_as_late() -> None:
    """What the run said before (the changes not recorded): the test can fail."""
    rec = load_recordings(RECORDED / NAME)
    for end in rec.end.values():
        end.pop("k_changes")
    found, _, _ = analyze(rec)
    assert any(f.cls == "F13" and f.severity == "error" for f in found), found
