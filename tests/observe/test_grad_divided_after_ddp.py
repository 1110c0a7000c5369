"""Gradients divided by the world size by hand on top of DDP's average (blind round 134 a_b01).

A DDP trainer class, each micro-batch's mean / K (right), then ``p.grad.div_(world_size)``
before the step, believing DDP sums: recorded on 2 gloo ranks, the update is 1/W of the large
batch's. The ledger saw the total of 1/W but called it "not judged" (a constant weight of 0.5
gives the same), because the loss carried a constant (/ K). Each rank's tokens weighed 1 in
all before the reduction (its window's mean), so no constant of the loss explains the 1/W:
the factor after the backwards does, and it is F10 at error. The twin, which leaves the
average to DDP, is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_grads_divided_by_w_after_ddp_average_are_f10() -> None:
    errors = [f for f in judge_recorded("r134_ddp_grad_divided_by_world_by_hand") if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "each rank's tokens weighed 1 in all before the reduction" in errors[0].evidence
    assert "factor of 0.25 where an average over the 2 ranks is 0.5" in errors[0].evidence


def test_grads_left_to_ddp_are_silent() -> None:
    assert [f for f in judge_recorded("r134_ddp_grad_left_to_ddp_average") if f.severity == "error"] == []
