"""A hinge GAN on spawned ranks, no DDP, gradients averaged by hand in an optimizer step
pre-hook (``opt.register_step_pre_hook``), recorded on 2 gloo ranks (blind round 102): the
step's checksum is read before an optimizer's own pre-hooks run, so the ranks' checksums
differ though the optimizers receive the averaged gradient. The fixed script, with the hook
on both optimizers, was "ranks train different models" (F11 at error); the step record now
says the optimizer had pre-hooks and its steps are not compared. The buggy script, whose
critic optimizer has no hook (never averaged), is still an error."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_gradients_averaged_in_step_pre_hooks_are_not_compared_before_them() -> None:
    assert [f for f in judge_recorded("r102_reduced_in_step_pre_hooks")
            if f.severity == "error"] == []


def test_an_optimizer_without_the_averaging_pre_hook_is_still_an_error() -> None:
    errors = [f for f in judge_recorded("r102_one_optimizer_without_the_pre_hook")
              if f.severity == "error"]
    assert errors and {f.cls for f in errors} <= {"F10", "F11"}, errors
