"""A loss multiplied by a coefficient of the script's own is not a loss scale error
(blind round 88 c_b03): token distillation ``(kl * mask).sum() * T * T / n_window`` with
T = 2 and K = 4 makes each window weigh T^2 = 4 = K, which read as "the loss is not
divided by K". The record shows the two multiplications by 2; without them each window
weighs 1: a note saying the coefficient was not judged. The script's real bug (each rank
divides by its own token count, F6) is still the one error. The rules run in this process
on the first three steps of the run's recording (2 DDP ranks on gloo, ``watch --keep``).
A loss never divided by K, with no coefficient, stays an error
(tests/observe/test_f5_loss_weights.py, tests/runtime/test_watch_f5.py)."""

from __future__ import annotations

from helpers import judge_recorded


def test_a_temperature_squared_equal_to_k_is_not_called_undivided() -> None:
    findings = judge_recorded("r88_kd_temperature_squared")
    errors = [f for f in findings if f.severity == "error"]
    assert [f.cls for f in errors] == ["F6"], findings
    notes = [f for f in findings if f.cls == "LOSS_SCALE"]
    assert notes and all(f.severity == "note" for f in notes), notes
    assert "not judged" in notes[0].title and "(4; e.g." in notes[0].evidence
