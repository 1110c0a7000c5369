"""A penalty on the parameters added to every micro-step beside a loss normalised over the
whole window (blind round 89 a_b03: an HF Trainer subclass adding an L2-SP penalty, a sum
over every parameter of ``(p - p0).pow(2).sum()``, after ``super().compute_loss`` under
``num_items_in_batch``; the Trainer then no longer divides by K, so the penalty weighs K x
its coefficient). Three pieces had to hold, each tested here:

* the walk below the backward's root reads a sum over many parameters as one penalty term
  (it used to run out of its node budget and record no term at all);
* it walks through DDP's output sink (``_DDPSinkBackward``, under static graph or unused
  parameters) to the loss call, not into the model's other outputs;
* the penalty rule accepts a loss call normalised over the window (one weight per token
  across micro-steps of different counts, no ``/ K``) as the term beside it.

The rule runs on the first three steps of the two runs' recordings (2 DDP ranks on gloo,
``watch --keep``); the twin divides the penalty by K and is silent."""

from __future__ import annotations

import torch
import torch.distributed as dist
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


class _TwoOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 3)
        self.unused = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.body(x)
        return {"loss": F.cross_entropy(logits, y, reduction="sum") / 7.0, "logits": logits}


def test_the_walk_passes_ddps_output_sink_to_the_loss() -> None:
    # one rank on an in-memory store: no port, nothing outside this process
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(_TwoOutputs(),
                                                         find_unused_parameters=True)
        out = ddp(torch.randn(5, 4), torch.randint(0, 3, (5,)))
        root = out["loss"] * 2.0
        names = []
        node = root.grad_fn
        while node is not None and len(names) < 6:
            names.append(type(node).__name__)
            node = node.next_functions[0][0] if node.next_functions else None
        assert "_DDPSinkBackward" in names, names  # the sink this test is about
        w = walk(root)
        leaves = [(type(leaf.node).__name__, leaf.divs) for leaf in w.leaves]
        assert leaves == [("NllLossBackward0", [["*", 2.0], ["/", 7.0]])], leaves
        root.backward()
    finally:
        dist.destroy_process_group()
