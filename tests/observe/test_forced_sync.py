"""A DDP window whose last forward ran under ``no_sync`` reads as unsynchronised (DDP decides
at the forward), but Accelerate's ``trigger_sync_in_backward`` (the reducer prepared again
after the forward) still reduces the backward: when every rank's optimizer received the same
gradient, the sync-flag F11 ("stepped on gradients not reduced across ranks") is disproved
and not said (blind round 74 a_b03_fixed, a false F11 before). Ranks that received different
gradients keep it, and the cross-rank F11 says so too."""

from __future__ import annotations

from typing import Any

from accumguard.watch._findings import RunRecording, analyze

K = 3


def _rec(same: bool) -> RunRecording:
    steps: dict[int, list[dict[str, Any]]] = {}
    for r in (0, 1):
        steps[r] = [{"kind": "step", "rank": r, "step": i, "backwards": K, "applied": True,
                     "engine": "ddp", "sync_micros": [False] * K, "sync_backward": [None] * K,
                     "forwards": [1] * K,
                     "checksum": [0.5 + i, 0.25, 2.0 + i] if same or r == 0
                     else [0.9 + i, 0.1, 2.0 + i]}
                    for i in range(3)]
    return RunRecording(steps=steps, world=2, end={0: {"kind": "end"}, 1: {"kind": "end"}})


def _f11(same: bool) -> list[Any]:
    found, _, _ = analyze(_rec(same), k_flag=K)
    return [f for f in found if f.severity == "error" and f.cls == "F11"]


def test_a_forced_sync_that_every_rank_received_alike_is_not_f11() -> None:
    assert _f11(same=True) == []


def test_ranks_that_received_different_gradients_keep_the_f11() -> None:
    found = _f11(same=False)
    assert any(f.rank is None and "differs across ranks" in f.evidence for f in found), found
    assert any(f.rank is not None and "not reduced across ranks" in f.evidence for f in found)
