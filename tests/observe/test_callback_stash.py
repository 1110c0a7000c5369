"""A callback that stashes each micro-step's gradient (blind round 97 a_b01): an HF Trainer
callback logs per-micro-batch gradient norms by moving ``.grad`` into a stash after every
non-final micro-step (``p.grad = None``), all-reduces the stash by hand and puts it back.
Put back in ``on_optimizer_step`` (after the step), each update holds only the last
micro-batch: F3 (a torch loop has no engine reset, so not "F2/F3"). Put back in
``on_pre_optimizer_step`` (the twin), every rank received one multiple of all ranks'
contributions: nothing was lost, silent (watch said F2/F3 at error). On the runs'
recordings (2 gloo ranks, five steps)."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_stash_put_back_after_the_step_is_f3() -> None:
    errors = [f for f in judge_recorded("r97_callback_stash_restored_after_step")
              if f.severity == "error"]
    assert {f.cls for f in errors} == {"F3"}, errors
    assert all("no zero_grad ran" in f.title for f in errors)


def test_stash_put_back_before_the_step_is_silent() -> None:
    findings = judge_recorded("r97_callback_stash_restored_before_step")
    assert not [f for f in findings if f.severity == "error"], findings
