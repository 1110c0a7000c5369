"""The walk below a backward's root passes DDP's pass-through Function (``_DDPSink``, on
the forward's outputs when ``find_unused_parameters`` is set: the HF Trainer's default).
Before, a loss computed inside the model stopped there: its constants up to the root were
not read, and the per-term ledger took "not read" for "no coefficient" (blind round 125
b_c03: a distillation whose CE coefficient 1 - alpha = 0.5 times W = 2 made 1, called F10
"2x too small" on a correct script)."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.nn.parallel.distributed import _DDPSink

from accumguard.observe._losses_walk import walk


class _Holder:
    """What ``_DDPSink.forward`` reads of its DDP module."""

    _ddp_sink_clone = True


def _outputs() -> tuple[torch.Tensor, torch.Tensor, int]:
    """(loss, logits) as DDP returns them: both through one ``_DDPSink``; and the CE
    call's node."""
    torch.manual_seed(0)
    w = torch.randn(4, 5, requires_grad=True)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 4, 0])
    logits = x @ w
    ce = F.cross_entropy(logits, y, reduction="sum")
    node = ce.grad_fn._sequence_nr()
    holder = _Holder()
    loss, out_logits = _DDPSink.apply(weakref.ref(holder), ce / 42.0, logits)
    return loss, out_logits, node


def test_a_loss_made_in_the_model_keeps_its_constants_through_the_sink() -> None:
    loss, logits, ce = _outputs()
    kd = logits.log_softmax(-1).mean()
    root = (0.5 * loss + 0.5 * kd) * 2
    w = walk(root, frozenset([ce]))
    assert ce in w.chain, "the walk stopped at DDP's sink"
    assert w.chain[ce][0] == [["*", 2.0], ["*", 0.5], ["/", 42.0]]
    assert w.complete


def test_both_outputs_are_walked_through_the_one_sink_node() -> None:
    """The sink is one node for every output: a path through output 1 after one through
    output 0 is still walked (not skipped as seen)."""
    loss, logits, ce = _outputs()
    root = loss + logits.sum() * 3.0
    w = walk(root, frozenset([ce]))
    assert ce in w.chain
    names = {type(leaf.node).__name__ for leaf in w.leaves}
    assert "MmBackward0" in names, names


NAME = "r125_hf_distill_coefficient_times_world"


def _with_ce_chain(chain: list[list[object]] | None) -> list[object]:
    """The recorded run (2 gloo ranks, HF Trainer + DDP, CE computed in the model times
    1 - alpha = 0.5, the whole loss times W = 2) judged with the CE records' constants
    replaced by ``chain``."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from tests.helpers import RECORDED

    rec = load_recordings(RECORDED / NAME)
    for lines in rec.steps.values():
        for step in lines:
            for r in step.get("losses") or []:
                if str(r[0]).endswith(":54"):
                    r[9] = chain
    found, _, _ = analyze(rec)
    return list(found)


def test_the_distillation_run_is_silent() -> None:
    from tests.helpers import judge_recorded

    assert [f for f in judge_recorded(NAME) if f.severity in ("error", "warning")] == []


def test_a_term_whose_constants_were_not_read_is_not_judged() -> None:
    """Not read (None): no claim. Read as no constants at all ([]), the same weights are a
    term 2x too small: the claim the run made before, and what an unread chain must not
    become."""
    assert [f for f in _with_ce_chain(None) if f.severity == "error"] == []
    assert {f.cls for f in _with_ce_chain([]) if f.severity == "error"} == {"F10"}
