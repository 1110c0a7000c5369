"""F8 across ranks: every rank's optimizer received the same gradient, but the norm clip
after the window's last backward shrank it by a different factor on each rank: each rank
clipped its own gradient before a hand-written all-reduce combined them (blind round 68
b_b03). Clip factors equal on every rank (the clip after the sync) say nothing; ranks that
received different gradients are F11's to judge."""

from __future__ import annotations

from typing import Any

from accumguard.watch._findings import RunRecording, analyze


def _rec(clips: tuple[float, float], same: bool = True) -> RunRecording:
    steps: dict[int, list[dict[str, Any]]] = {}
    for r, clip in enumerate(clips):
        steps[r] = [{"kind": "step", "rank": r, "step": i, "backwards": 3, "applied": True,
                     "engine": "local", "reductions": 1, "clips": 1, "clip_micros": [3],
                     "checksum": [0.5 + i, 0.25, 2.0 + i] if same or r == 0
                     else [0.9 + i, 0.1, 2.0 + i],
                     "conservation": {"params": 4, "wiped": 0.0, "stale": 0.0,
                                      "received": 0.3, "ok": True, "reason": "",
                                      "scale": clip * 0.5, "clip": clip}}
                    for i in range(3)]
    return RunRecording(steps=steps, world=2, end={0: {"kind": "end"}, 1: {"kind": "end"}})


def _errors(rec: RunRecording) -> list[Any]:
    found, _, _ = analyze(rec, k_flag=3)
    return [f for f in found if f.severity == "error"]


def test_each_rank_clipped_by_its_own_norm_before_the_sync() -> None:
    found = _errors(_rec((0.5578, 0.3758)))
    assert [f.cls for f in found] == ["F8"], found
    assert "rank 0: 0.5578, rank 1: 0.3758" in found[0].evidence
    assert "before the ranks' gradients were combined" in found[0].title


def test_one_factor_on_every_rank_is_the_synchronised_gradients_clip() -> None:
    assert _errors(_rec((0.5578, 0.5578))) == []


def test_ranks_that_received_different_gradients_are_not_this_rule() -> None:
    assert "F8" not in {f.cls for f in _errors(_rec((0.5578, 0.3758), same=False))}
