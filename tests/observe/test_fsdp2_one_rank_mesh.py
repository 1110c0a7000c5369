"""FSDP2 built on ``mesh["shard"]``, the size-1 dimension of a (2, 1) mesh, on 2 gloo ranks
(blind round 101 b_b02): each unit's reduce-scatter is over its own rank, no collective
reduces a gradient, the ranks train apart. F10 at error, read from FSDP2's mesh size (silent
before: FSDP2's gradients are not compared across ranks, their shards differ by design),
and no LOSS_SCALE note saying FSDP2 "already averages". Its twin, FSDP2 over the whole
2-D mesh (HSDP), is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_fsdp2_on_a_one_rank_mesh_is_f10() -> None:
    found = judge_recorded("r101_fsdp2_on_one_rank_mesh")
    errors = [f for f in found if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], found
    assert "mesh spans 1 rank of the run's 2" in errors[0].evidence
    assert not [f for f in found if f.cls == "LOSS_SCALE"], found


def test_fsdp2_over_the_whole_mesh_is_silent() -> None:
    assert [f for f in judge_recorded("r101_fsdp2_hsdp_whole_mesh")
            if f.severity in ("error", "warning")] == []
