"""Blind round 128 a_b02, recorded on 2 gloo ranks (DeepSpeed ZeRO-2 on CPU): the engine's
config is ``asdict()`` of a dataclass whose accumulation field is named
``accumulate_grad_batches`` (Lightning's word). DeepSpeed ignores the key and runs
gradient_accumulation_steps = 1: 40 optimizer steps, one per backward, where the script
meant 10 windows of 4. Before the rule the run said a note only ("if it meant to
accumulate, pass --accumulation-steps to decide")."""

from __future__ import annotations

import pytest

from accumguard.static.dsconfig import ignored_accumulation
from tests.helpers import judge_recorded


def test_an_accumulation_key_deepspeed_ignores_is_f1_at_error() -> None:
    found = judge_recorded("r128_ds_accumulation_key_ignored")
    f1 = [f for f in found if f.cls == "F1"]
    assert f1 and all(f.severity == "error" for f in f1), found  # the note is gone
    assert f1[0].title == ("DeepSpeed ignored the accumulation of 4 the config asked for: "
                           "every engine.step() stepped")
    assert "under `accumulate_grad_batches`" in f1[0].evidence
    assert "40 optimizer steps observed followed one backward" in f1[0].evidence
    assert "gradient_accumulation_steps" in f1[0].fix


def test_the_config_reading_names_only_an_ignored_accumulation_above_one() -> None:
    base = {"train_micro_batch_size_per_gpu": 4}
    assert ignored_accumulation({**base, "accumulate_grad_batches": 4}) == ("accumulate_grad_batches", 4)
    assert ignored_accumulation({**base, "gradient_accumulation_step": 8}) == ("gradient_accumulation_step", 8)
    assert ignored_accumulation({**base, "accumulate_grad_batches": 1}) is None
    # DeepSpeed derives the accumulation from train_batch_size: nothing is lost
    assert ignored_accumulation({**base, "train_batch_size": 32, "grad_accum": 4}) is None
    assert ignored_accumulation({**base, "gradient_accumulation_steps": 4, "accum": 4}) is None
    # a known key, or an unrelated one, is not an accumulation
    assert ignored_accumulation({**base, "steps_per_print": 10}) is None


def test_a_fault_in_the_read_leaves_it_out_and_keeps_the_engine_facts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The read runs inside the engine-facts statement of ``note_engine``: a failure of its own
    must not cost the stage, GA and clipping recorded beside it."""
    from accumguard.observe import _patch_deepspeed
    from accumguard.static import dsconfig

    cfg = {"train_micro_batch_size_per_gpu": 4, "accumulate_grad_batches": 4}
    assert _patch_deepspeed._ignored_accumulation(cfg) == ["accumulate_grad_batches", 4]

    def boom(_: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(dsconfig, "ignored_accumulation", boom)
    assert _patch_deepspeed._ignored_accumulation(cfg) is None
