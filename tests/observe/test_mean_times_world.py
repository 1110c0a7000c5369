"""Blind round 125 b_b01, recorded on 2 gloo ranks: the stock transformers Trainer on a
token-classification model whose forward takes ``**kwargs`` (so the Trainer expects its loss
normalised by ``num_items_in_batch``: it multiplies by the number of processes and skips its
own / K) while the library's head returns each micro-batch's mean. Each micro-step's mean
weighs W = 2, K = 4 of them per window: the update is K x W = 8x the large batch's. The run
said F5 only (the unequal token weights); the scale is LOSS_SCALE at error beside it."""

from __future__ import annotations

from tests.helpers import judge_recorded

NAME = "r125_hf_token_head_mean_times_world"


def test_a_mean_times_w_undivided_by_k_is_loss_scale_beside_f5() -> None:
    errors = {f.cls: f for f in judge_recorded(NAME) if f.severity == "error"}
    assert set(errors) == {"F5", "LOSS_SCALE"}, errors
    scale = errors["LOSS_SCALE"]
    assert scale.title.startswith("loss 8x too large"), scale.title
    assert "total weight of 2 = W" in scale.evidence and "K = 4" in scale.evidence
