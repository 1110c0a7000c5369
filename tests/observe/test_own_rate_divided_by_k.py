"""An optimizer that steps after every backward while another accumulates K is judged as
stepping at its own rate (a GAN's discriminator, a critic): a note. But when every loss it
stepped on was divided by K, the accumulation's own scaling, it was meant to accumulate too
(blind round 90 a_b03: Lightning manual optimisation whose head optimizer's step and
zero_grad sit outside the `(batch_idx + 1) % K` test, on `loss / K`): F1, an error. The
rules run on the run's recording (2 DDP ranks on gloo, ``watch --keep``, K = 3 as the
script declares it); the note for an optimizer on an undivided loss is in
tests/observe/test_several_optimizers.py."""

from __future__ import annotations

from helpers import judge_recorded


def test_a_fast_optimizer_on_a_loss_divided_by_k_is_f1() -> None:
    findings = judge_recorded("r90_lightning_head_steps_each_micro", 3)
    errors = [f for f in findings if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"F1"}, findings
    assert "a loss divided by K = 3" in errors[0].title
    assert "receives 1/3 of one micro-batch's gradient" in errors[0].evidence
