"""Blind round 124 b_b03: Accelerate with two models under nested ``accumulate()`` contexts
(``with acc.accumulate(policy), acc.accumulate(value):``), K = 4. Each context advances
Accelerate's step counter, so both optimizers step every 2 micro-batches. Recorded on 2 gloo
ranks. Before: an F7 note claiming every epoch was shorter than K (a DataLoader pass start
was lent from one optimizer's record to the next and on to every later one), then an F13
"counted from the wrong origin"; it is F1, stepping every 2 micro-steps where K = 4."""

from __future__ import annotations

from accumguard.observe._groups import optimizer_groups
from tests.helpers import RECORDED, judge_recorded


def test_nested_accumulate_contexts_step_every_two_micro_steps() -> None:
    found = judge_recorded("r124_accelerate_nested_accumulate_contexts")
    f1 = [f for f in found if f.cls == "F1" and f.severity == "error"]
    assert f1 and "every 2 micro-steps where K = 4" in f1[0].title, found
    assert not [f for f in found if f.cls in ("F7", "F13")], found


def test_a_pass_start_is_lent_to_the_next_record_only() -> None:
    from accumguard.watch._findings import load_recordings

    rec = load_recordings(RECORDED / "r124_accelerate_nested_accumulate_contexts")
    groups = dict(optimizer_groups(rec.steps[0]))
    starts = [[0 in (s.get("data_pass_starts") or ()) for s in ss] for ss in groups.values()]
    # the run's one pass begins in the first window, which both optimizers step on
    assert [row[:2] for row in starts] == [[True, False], [True, False]], starts
