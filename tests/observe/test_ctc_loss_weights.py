"""CTC losses are recorded (blind round 95 c_b02): a speech model on 2 DDP ranks with
frame-budget batching sums ``nn.CTCLoss`` over each micro-batch, divides by that
micro-batch's utterance count, then by K: micro-batches of 4-7 utterances weigh the same,
so one utterance weighs up to 2.5x another (F5, in utterances, not tokens). The twin divides
the summed loss by the window's all-ranks utterance count (times W): silent. Before
``ctc_loss`` was recorded both runs were silent."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import judge_recorded


def test_ctc_sum_divided_per_micro_batch_is_f5_in_samples() -> None:
    errors = [f for f in judge_recorded("r95_ctc_sum_mean_per_micro") if f.severity == "error"]
    assert {f.cls for f in errors} == {"F5"}, errors
    assert "uneven sample counts" in errors[0].title
    assert "valid samples" in errors[0].evidence and "token" not in errors[0].evidence
    assert "per-sample losses" in errors[0].fix


def test_ctc_sum_over_the_window_count_is_silent() -> None:
    findings = judge_recorded("r95_ctc_sum_over_window_count")
    assert not [f for f in findings if f.severity == "error"], findings


@pytest.mark.parametrize(("shape", "reduction", "n", "mean"), [
    ((12, 5, 6), "mean", 5, True), ((12, 5, 6), "sum", 5, False), ((12, 6), "sum", 1, False)])
def test_read_ctc_counts_utterances(shape: tuple[int, ...], reduction: str, n: int,
                                    mean: bool) -> None:
    from accumguard.observe._loss_args import read_ctc

    logp = torch.randn(*shape, requires_grad=True).log_softmax(-1)
    batched = len(shape) == 3
    targets = torch.randint(1, 6, (n, 3) if batched else (3,))
    in_lens = torch.full((n,), 12) if batched else torch.tensor(12)
    tgt_lens = torch.full((n,), 3) if batched else torch.tensor(3)
    args = (logp, targets, in_lens, tgt_lens)
    out = torch.nn.functional.ctc_loss(*args, reduction=reduction)
    got = read_ctc(out, args, {"reduction": reduction})
    assert got is not None
    _, count, is_mean, low, rows, unit = got
    assert (count, is_mean, low, rows, unit) == (n, mean, False, n, "samples")
    none = torch.nn.functional.ctc_loss(*args, reduction="none")
    assert read_ctc(none, args, {"reduction": "none"}) is None
