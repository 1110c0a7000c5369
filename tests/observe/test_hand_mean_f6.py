"""A reward trainer (HF Trainer subclass on 2 gloo ranks, blind round 111 a_b02) giving each
rank its own length bucket with a token-budget micro-batch size (6 pairs per micro-batch on
rank 0, 4 on rank 1) and returning each micro-batch's pair mean, built by hand
(``-logsigmoid(margin).mean()``: no recorded loss call). The Trainer's /K and DDP's average
then weigh the ranks' means alike: F6, with each rank's weight per pair. The twin that
normalises by the window's pair count over the ranks has no error; one rank alone proves
nothing."""

from __future__ import annotations

from accumguard.observe._hand_mean_rules import hand_mean_rank_findings
from accumguard.observe._records import window_lines
from accumguard.watch._findings import load_recordings

from helpers import RECORDED, judge_recorded


def test_ranks_means_over_uneven_counts_are_f6() -> None:
    found = [f for f in judge_recorded("r111_reward_rank_buckets_pair_means")
             if f.severity.value == "error"]
    assert [(f.cls, f.step) for f in found] == [("F6", 1)], found
    ev = found[0].evidence
    assert "6 element(s) on rank 0, 4 element(s) on rank 1" in ev, ev
    assert "rank 0: 1/48, rank 1: 1/32 instead of 1/40" in ev, ev


def test_the_window_count_twin_has_no_error() -> None:
    assert [f for f in judge_recorded("r111_reward_rank_buckets_window_count")
            if f.severity.value == "error"] == []


def test_one_rank_alone_proves_nothing() -> None:
    rec = load_recordings(RECORDED / "r111_reward_rank_buckets_pair_means")
    assert hand_mean_rank_findings({0: window_lines(rec.steps[0])}) == []
    both = {r: window_lines(rec.steps[r]) for r in rec.ranks}
    assert [f.cls for f in hand_mean_rank_findings(both)] == ["F6"]
