"""Double gating under Accelerate with epochs that end in a short window (blind round 94
a_b01): a runner class puts a whole window of K = 4 micro-batches, each divided by 4, inside
one ``accumulate()`` block while the Accelerator was built with gradient_accumulation_steps
= 4 from a config dataclass. Accelerate steps every 4 blocks (16 backwards) and at each
DataLoader's end (a 2-block tail of 8). The F14 rule asked every window but one to be full,
and this 2-epoch run has two tails: it was silent. On the run's recording (2 gloo ranks,
torchrun) it is F14 at error level; the twin built with gradient_accumulation_steps = 1 is
silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_window_in_one_accumulate_block_with_epoch_tails_is_f14() -> None:
    errors = [f for f in judge_recorded("r94_accelerate_window_in_one_accumulate")
              if f.severity == "error"]
    assert {f.cls for f in errors} == {"F14"}, errors
    assert "double gating" in errors[0].title
    assert "divided by 16 in all" in errors[0].evidence


def test_accelerator_without_its_own_accumulation_is_silent() -> None:
    findings = judge_recorded("r94_accelerate_window_in_one_accumulate_ga1")
    assert not [f for f in findings if f.severity == "error"], findings
