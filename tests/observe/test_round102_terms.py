"""Blind round 102, recorded on 2 gloo ranks:

* A DPO trainer with an SFT term returning ``dpo + w * nll / K`` (c_b03): both terms are
  means built from torch ops (no recorded loss call), only the NLL is divided by K, so the
  DPO term weighs K x its coefficient against it. Its twin divides the whole sum.
* A LightningModule ``backward`` override adding an orthogonality penalty
  ``((w @ w.T - I) ** 2).sum()`` to the loss Lightning has already divided by K (a_b02):
  a product of parameters was read as data mixed in, so the penalty was not one. Its twin
  divides the penalty by K.
"""

from __future__ import annotations

from typing import Any

import torch

from accumguard.observe._losses_walk import params_only
from tests.helpers import judge_recorded


def _errors(name: str) -> list[Any]:
    return [f for f in judge_recorded(name) if f.severity == "error"]


def test_one_mean_term_divided_by_k_and_one_not_is_loss_scale() -> None:
    errors = _errors("r102_dpo_sft_one_term_divided")
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    text = errors[0].evidence
    assert "LogSigmoidBackward0" in text and "is not" in text and "K = 4" in text


def test_the_whole_sum_divided_by_k_is_silent() -> None:
    assert _errors("r102_dpo_sft_sum_divided") == []


def test_a_penalty_added_in_a_lightning_backward_override_is_loss_scale() -> None:
    errors = _errors("r102_lightning_backward_adds_penalty")
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    assert "penalty on the parameters" in errors[0].evidence
    assert "LightningModule" in errors[0].fix


def test_the_penalty_divided_by_k_is_silent() -> None:
    assert _errors("r102_lightning_penalty_divided") == []


def test_a_product_is_a_penalty_only_between_parameters() -> None:
    w = torch.nn.Parameter(torch.randn(4, 3))
    gram = ((w @ w.t() - torch.eye(4)) ** 2).sum()
    assert params_only(gram.grad_fn)
    x = torch.randn(5, 4)
    assert not params_only(((x @ w) ** 2).sum().grad_fn)
    # an input given requires_grad (an adversarial perturbation) is a leaf, not a parameter
    delta = torch.zeros(4, 3, requires_grad=True)
    assert not params_only(((delta @ w.t()) ** 2).sum().grad_fn)


def test_an_adversarial_pass_averaged_per_micro_batch_is_f5() -> None:
    """HF FGM adversarial training, two backwards per micro-step at one loss site: the clean
    pass summed over ``num_items_in_batch``, the adversarial pass each micro-batch's own
    token mean / K (round 102 a_b03). The site's records alternate reductions; the
    adversarial pass's records, every 2nd backward, are judged as one micro-step each."""
    errors = _errors("r102_hf_adversarial_pass_mean_per_micro_batch")
    assert {f.cls for f in errors} == {"F5"}, errors
    assert "every 2nd of the window's 4 backwards" in errors[0].evidence


def test_an_adversarial_pass_given_num_items_is_silent() -> None:
    assert _errors("r102_hf_adversarial_pass_num_items") == []
