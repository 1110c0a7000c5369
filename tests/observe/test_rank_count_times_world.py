"""A rank-local count times W (blind round 96 a_b03): Accelerate's loss-normalisation
recipe (sum over the window's tokens, times ``num_processes``) with the gather of the count
left out: each rank divides by its own count, so the ranks' tokens weigh differently (F6)
and the step's total weight is W where the large batch gives 1. watch said both F6 and an
F10 whose fix was "do not multiply the loss by the world size", which contradicts F6's fix
(count over all processes, then times W) and would leave the F6 bug in place. One finding
now: F6, its evidence stating the total its fix also mends (on the run's recording, 2 gloo
ranks, first five steps); the twin that gathers the count is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_rank_count_times_world_is_f6_alone_with_the_total() -> None:
    errors = [f for f in judge_recorded("r96_accelerate_rank_count_times_w")
              if f.severity == "error"]
    assert [f.cls for f in errors] == ["F6"], errors
    assert "total weight of 2 (W" in errors[0].evidence
    assert "num_processes" in errors[0].fix


def test_global_count_times_world_is_silent() -> None:
    findings = judge_recorded("r96_accelerate_global_count_times_w")
    assert not [f for f in findings if f.severity == "error"], findings
