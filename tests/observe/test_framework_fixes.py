"""The fix worded for the framework that drove the run: the observer notes Lightning's
Trainer, the HF TrainingArguments and Accelerate's backward; the rules then give a class's
fix in that framework's idiom where the finding gave the generic one (an F1 in an
Accelerate loop names ``accelerator.accumulate``, not bare optimizer calls). Real
frameworks, one process; Lightning's DDP case is in tests/runtime/test_watch_lightning_ddp.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias
from torch import nn

from accumguard.core.findings import Finding, Severity
from accumguard.core.taxonomy import fix_for, fix_in
from accumguard.observe._framework_fixes import framework_fixes
from accumguard.watch import recording
from accumguard.watch._report import judge

K = 4


def _finding(cls: str, fix: str | None = None) -> Finding:
    return Finding(cls, Severity.ERROR, 0, 1, None, "evidence", fix_for(cls) if fix is None
                   else fix, cls)


def test_generic_fixes_take_the_outermost_frameworks_idiom() -> None:
    # the HF Trainer runs on Accelerate: its users write neither accumulate() nor backward
    out = framework_fixes([_finding("F1")], {"accelerate", "transformers"})
    assert out[0].fix.startswith("Hugging Face Trainer:"), out[0].fix
    assert framework_fixes([_finding("F1")], set())[0].fix == fix_for("F1")


def test_a_fix_worded_from_a_measurement_is_kept() -> None:
    own = _finding("F4", "Compute the horizon in the scheduler steps the run makes: 12.")
    assert framework_fixes([own], {"lightning"}) == [own]


def test_a_sync_fix_naming_ddps_no_sync_is_replaced_and_others_are_kept() -> None:
    ddp = _finding("EXTRA_SYNC", "Run micro-steps 1..K-1 inside `with model.no_sync():`.")
    fsdp = _finding("EXTRA_SYNC", "Call model.set_requires_gradient_sync(False) before ...")
    out = framework_fixes([ddp, fsdp], {"accelerate"})
    assert out[0].fix == fix_in("EXTRA_SYNC", ["accelerate"]) and out[1] == fsdp


def test_accelerate_step_every_micro_step_is_f1_with_accelerates_fix(tmp_path: Path) -> None:
    """Accelerator(gradient_accumulation_steps=K) declares K, but the loop steps the
    prepared optimizer on every micro-step without accumulate(): F1, fixed with
    accelerate's accumulate(), the frameworks noted in the recording."""
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    with recording(tmp_path):
        acc = accelerate.Accelerator(gradient_accumulation_steps=K, cpu=True)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = acc.prepare(model, opt)
        for _ in range(3 * K):
            x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
            acc.backward(F.cross_entropy(model(x), y) / K)
            opt.step()
            opt.zero_grad()
    res = judge(tmp_path)
    f1 = [f for f in res.findings if f.cls == "F1" and f.severity == "error"]
    assert f1, res.findings
    assert f1[0].fix == fix_in("F1", ["accelerate"]), f1[0].fix
    assert "accelerator.accumulate(model)" in f1[0].fix


def test_trainers_are_noted_when_built(tmp_path: Path) -> None:
    """Building the HF TrainingArguments or Lightning's Trainer under observation names
    the framework (nothing trains here: the names are what the fixes are chosen by)."""
    transformers = pytest.importorskip("transformers")
    pl = pytest.importorskip("pytorch_lightning")
    with recording(tmp_path) as obs:
        transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to=[],
                                       use_cpu=True)
        pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False)
        assert sorted(obs.frameworks) == ["lightning", "transformers"], obs.frameworks
