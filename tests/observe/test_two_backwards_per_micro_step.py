"""HF Trainer with adversarial training (FGM: a second, perturbed forward and backward in
every training_step), K = 2, DDP on 2 gloo ranks (blind round 102 a_b03_fixed, a correct
script): windows of 4 backward passes, the sync off for the first micro-step's two and on for
the last one's two. Those are K micro-steps of two backwards each, not a boundary 2
micro-steps late (F13 at error before); the second synced backward's all-reduce is extra
communication (EXTRA_SYNC, a warning), no error."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_two_backwards_per_micro_step_synced_on_the_last_is_no_late_boundary() -> None:
    found = judge_recorded("r102_hf_two_backwards_per_micro_step")
    assert [f for f in found if f.severity == "error"] == [], found
    assert not [f for f in found if f.cls == "F13"], found
