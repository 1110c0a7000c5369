"""Lightning with a ``GradientAccumulationScheduler({0: 4, 2: 2})`` (blind round 99 a_b01,
DDP, 2 gloo ranks, 4 epochs of 12 batches per rank): windows of 4 then of 2, each the K
Lightning set for its epoch, are no "boundary late" (F13 before); a cosine ``LambdaLR``
whose horizon is ``trainer.estimated_stepping_batches`` read in ``configure_optimizers``
(48, before the scheduler set K: the run's 48 backward passes) while the run makes 18
optimizer steps is F4 at error, with both numbers and the Lightning fix. The fixed twin
(the horizon summed per epoch from the callback's schedule: 18) is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_a_horizon_counting_batches_under_a_k_schedule_is_f4() -> None:
    found = judge_recorded("r99_lightning_k_schedule_horizon_in_batches")
    errors = [f for f in found if f.severity == "error"]
    assert sorted((f.cls, f.rank) for f in errors) == [("F4", 0), ("F4", 1)], found
    assert "horizon 48 scheduler steps, 18 reached in the run's 18" in errors[0].title
    assert "its horizon is the run's 48 backward passes" in errors[0].evidence
    assert "GradientAccumulationScheduler" in errors[0].fix
    assert not [f for f in found if f.cls == "F13"], found


def test_windows_of_each_epochs_k_and_a_summed_horizon_are_silent() -> None:
    found = judge_recorded("r99_lightning_k_schedule_horizon_summed")
    assert [f for f in found if f.severity in ("error", "warning") or f.cls == "F13"] == []
