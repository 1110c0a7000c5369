"""The short last window of each pass on data parallelism written by hand: the optimizer
received the ranks' average (an all-reduce then /W at the boundary), which is no multiple
of this rank's own backwards, so the conservation fit's scale says nothing about a rescale;
the loss record's n/K is still what the update weighs (blind round 73 b_b03: windows of
3, 3, 1 at K = 3, the 1 divided by K; missed before). A clip in such a window may have
rescaled it: then the window is not judged."""

from __future__ import annotations

from typing import Any

from accumguard.watch._findings import RunRecording, analyze

K = 3


def _line(step: int, n: int, *, start: bool, clips: int) -> dict[str, Any]:
    losses = [["/x/train.py:98", 0, m, 4, 1 / (4 * K), False, "mean", True, False,
               [["/", float(K)]], "tokens"] for m in range(n)]
    return {"kind": "step", "rank": 0, "step": step, "backwards": n, "applied": True,
            "engine": "local", "reductions": 1, "clips": clips,
            "clip_micros": [n] * clips, "data_pass_starts": [0] if start else [],
            "losses": losses,
            "conservation": {"params": 4, "wiped": 0.0, "stale": 0.0, "received": 0.3,
                             "ok": True, "reason": "", "scale": 0.6}}


def _errors(clips: int) -> list[Any]:
    sizes = [3, 3, 1, 3, 3, 1]
    lines = [_line(i, n, start=i in (0, 3), clips=clips) for i, n in enumerate(sizes)]
    rec = RunRecording(steps={0: lines}, world=1, end={0: {"kind": "end"}})
    found, _, _ = analyze(rec, k_flag=K)
    return [f for f in found if f.severity == "error"]


def test_a_short_tail_divided_by_k_under_a_hand_reduction_is_f7() -> None:
    errors = _errors(clips=0)
    assert [f.cls for f in errors] == ["F7"], errors
    assert errors[0].title.startswith("a short last window (1 of K = 3 micro-steps)")


def test_a_clipped_window_of_a_hand_reduction_is_not_judged() -> None:
    assert "F7" not in {f.cls for f in _errors(clips=1)}
