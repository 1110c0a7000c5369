"""Blind round 128 a_b02, recorded on 2 gloo ranks (DeepSpeed ZeRO-2 on CPU): the engine's
config is ``asdict()`` of a dataclass whose accumulation field is named
``accumulate_grad_batches`` (Lightning's word). DeepSpeed ignores the key and runs
gradient_accumulation_steps = 1: 40 optimizer steps, one per backward, where the script
meant 10 windows of 4. Before the rule the run said a note only ("if it meant to
accumulate, pass --accumulation-steps to decide")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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


def _fake_engine_class() -> type[torch.nn.Module]:
    """A module the observer takes for a DeepSpeed engine whose configuration cannot be read
    (an engine of a DeepSpeed version whose API moved)."""

    class DeepSpeedEngine(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.module(x)

        def gradient_clipping(self) -> float:
            return 0.0

        def zero_optimization_stage(self) -> int:
            raise AttributeError("'DeepSpeedConfig' object has no attribute 'zero_config'")

    DeepSpeedEngine.__module__ = "deepspeed.runtime.engine"
    return DeepSpeedEngine


def _steps(engine: torch.nn.Module) -> torch.Tensor:
    torch.manual_seed(0)
    opt = torch.optim.SGD(engine.parameters(), lr=0.1)
    for _ in range(3):
        loss = engine(torch.randn(5, 4)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in engine.parameters()])


def test_engine_facts_that_cannot_be_read_are_accumguards_failure(tmp_path: Path) -> None:
    """Without its stage and GA no DeepSpeed rule can judge the run: the failed read switches
    observation off and is recorded as accumguard's own failure (it used to be swallowed,
    leaving a DeepSpeed run judged as if it had no engine); the training is unchanged."""
    from accumguard.watch._recording import recording

    cls = _fake_engine_class()
    torch.manual_seed(1)
    unobserved = _steps(cls())
    with recording(tmp_path) as obs:
        torch.manual_seed(1)
        observed = _steps(cls())
        failure = obs.failure
    assert torch.equal(observed, unobserved)
    assert failure is not None, "the unreadable engine was judged without its facts"
    assert "zero_config" in failure.error and "note_engine" in failure.traceback
