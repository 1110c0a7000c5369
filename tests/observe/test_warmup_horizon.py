"""A warm-up is not a schedule that ends early (blind round 134 b_c03, a correct script).

Accelerate, two prepared `LambdaLR` warm-ups `min(1, (s + 1) / total)` with `total = 3 *
num_processes` (the prepared scheduler steps W times per optimizer step), K = 2, 12 steps
on 2 gloo ranks: each warm-up reaches its peak at optimizer step 3 and holds it, as meant.
The horizon rule read `total` as the schedule's end and called it "ends 4x early (W x K)", an
error on a correct run: a warm-up's length is its own choice, not the run's. When every
optimizer's rate only rose and then held, the end is a note."""

from __future__ import annotations

from accumguard.observe._schedules import _rises_to_plateau
from tests.helpers import judge_recorded


def test_a_warm_up_that_reached_its_peak_is_a_note_not_an_early_end() -> None:
    findings = judge_recorded("r134_accelerate_warmups_sized_per_process")
    assert not [f for f in findings if f.severity == "error"], findings
    notes = [f for f in findings if f.cls == "F4"]
    assert notes and {f.severity for f in notes} == {"note"}, notes  # (one per rank)
    assert "held its highest value: a warm-up" in notes[0].evidence


def test_only_rates_that_never_fell_and_rose_once_are_a_plateau() -> None:
    def steps(*rates: float, opt: int = 0) -> list[dict[str, object]]:
        return [{"lr": r, "optimizer_index": opt} for r in rates]

    assert _rises_to_plateau(steps(0.1, 0.2, 0.3, 0.3, 0.3))
    assert not _rises_to_plateau(steps(0.1, 0.3, 0.2))  # a decay: judged
    assert not _rises_to_plateau(steps(0.3, 0.3, 0.3))  # constant: no warm-up seen
    assert not _rises_to_plateau(steps(0.1, 0.2) + steps(0.5, 0.4, opt=1))  # one decays
    assert _rises_to_plateau(steps(0.1, 0.2) + steps(0.5, 0.5, opt=1))
