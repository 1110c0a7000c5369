"""DeepSpeed ZeRO-2, ``gradient_accumulation_steps`` 4, each micro-step's backward in its own
``engine.coalesce_grad_reduction()`` block (blind round 99 b_b01, 2 gloo ranks): the ledger
shows the gradient-sized flush after every backward, not only after the last; DeepSpeed's
flush overwrites the reduced gradients at each exit (one block per optimizer step), so only
the last micro-batch reaches the step: F2 (F14 before, a wrong class; silent after the F14
fix). One block around the whole window (its twin, recorded in
``r99_ds_coalesced_window_then_k_steps``) is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_a_window_split_over_coalesced_blocks_is_f2() -> None:
    errors = [f for f in judge_recorded("r99_ds_coalesced_block_per_micro_step")
              if f.severity == "error"]
    assert sorted((f.cls, f.rank) for f in errors) == [("F2", 0), ("F2", 1)], errors
    assert "split over 4 coalesce_grad_reduction() blocks" in errors[0].title
    assert "after backward pass(es) 1, 2, 3" in errors[0].evidence


def test_one_coalesced_block_per_window_is_silent() -> None:
    assert [f for f in judge_recorded("r99_ds_coalesced_window_then_k_steps")
            if f.severity == "error"] == []
