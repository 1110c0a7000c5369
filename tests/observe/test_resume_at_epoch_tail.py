"""A correct resume that lands on a pass's short tail (blind round 94 c_c01): distillation
on 2 spawned DDP ranks, passes of 10 micro-batches in windows of 4, 4 and 2 (each normalised
by its own all-ranks token count), interrupted after optimizer step 5 and resumed into
rebuilt objects at the next window, the pass's 2-batch tail. The rebuilt optimizer's first
window is short and its next one K, which the resume rule read as a counter restored off
(F13 at error level, a false alarm: the writer's uninterrupted run gives the same hash).
The short windows recur every third window before and after the rebuild: the tail is where
the run without the resume has it. No error now; the F13 of a resume whose first window
breaks that period stays (tests/observe/test_resume_counter.py)."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_resume_onto_the_passes_short_tail_is_not_f13() -> None:
    findings = judge_recorded("r94_resume_at_epoch_tail")
    assert not [f for f in findings if f.severity == "error"], findings
    assert not [f for f in findings if f.cls == "F13"], findings
