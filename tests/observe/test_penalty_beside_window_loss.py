"""A penalty on the parameters added to every micro-step beside a loss normalised over the
whole window (blind round 89 a_b03: an HF Trainer subclass adding an L2-SP penalty, a sum
over every parameter of ``(p - p0).pow(2).sum()``, after ``super().compute_loss`` under
``num_items_in_batch``; the Trainer then no longer divides by K, so the penalty weighs K x
its coefficient). Three pieces had to hold, each tested here:

* the walk below the backward's root reads a sum over many parameters as one penalty term
  (it used to run out of its node budget and record no term at all);
* (the recording was made while the walk also passed DDP's output sink, `_DDPSinkBackward`;
  that pass is withdrawn until launches that end in an abort at exit are explained: see
  docs/dev/blind-rounds.md, round 89);
* the penalty rule accepts a loss call normalised over the window (one weight per token
  across micro-steps of different counts, no ``/ K``) as the term beside it.

The rule runs on the first three steps of the two runs' recordings (2 DDP ranks on gloo,
``watch --keep``); the twin divides the penalty by K and is silent."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._losses_walk import walk

from helpers import judge_recorded


def test_the_penalty_per_micro_step_is_an_error() -> None:
    findings = judge_recorded("r89_trainer_penalty_per_micro_step")
    errors = [f for f in findings if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"LOSS_SCALE"}, findings
    assert "penalty on the parameters is not divided by K: it weighs 4x" in errors[0].title
    assert "normalised over the whole window" in errors[0].evidence


def test_the_penalty_divided_by_k_is_silent() -> None:
    findings = judge_recorded("r89_trainer_penalty_divided_by_k")
    assert not [f for f in findings if f.severity in ("error", "warning")], findings


def _penalised_loss(model: torch.nn.Module, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    anchor = {n: p.detach() + 0.1 for n, p in model.named_parameters()}
    total: torch.Tensor | float = 0.0
    for n, p in model.named_parameters():
        total = total + (p - anchor[n]).pow(2).sum()
    return F.cross_entropy(out, y, reduction="sum") / 12.0 + 0.5 * total


def test_a_sum_over_many_parameters_is_one_penalty_term() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(24)])
    x, y = torch.randn(5, 8), torch.randint(0, 8, (5,))
    w = walk(_penalised_loss(model, model(x), y))
    assert w.complete
    kinds = sorted((type(leaf.node).__name__, leaf.penalty) for leaf in w.leaves)
    assert kinds == [("AddBackward0", True), ("NllLossBackward0", False)], kinds
