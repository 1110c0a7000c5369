"""What a framework declares as K, read by the observer when the framework is constructed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from accumguard.observe import Observer

pl = pytest.importorskip("pytorch_lightning")


@pytest.mark.parametrize(("accumulate", "declared"), [(1, None), (4, 4)])
def test_lightning_declares_k_only_above_its_default(accumulate: int, declared: int | None
                                                     ) -> None:
    """Lightning's default ``accumulate_grad_batches=1`` says nothing about K: a module with
    manual optimisation accumulates itself (and Lightning refuses any other value there), so
    a declared K = 1 would misname every window of such a run."""
    with Observer(roots=[]) as obs:
        pl.Trainer(accumulate_grad_batches=accumulate, accelerator="cpu", logger=False,
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False)
        assert obs.declared_k.get("lightning") == declared


@pytest.mark.parametrize(("steps", "declared"), [(1, None), (4, 4)])
def test_transformers_declares_k_only_above_its_default(tmp_path: Any, steps: int,
                                                        declared: int | None) -> None:
    transformers = pytest.importorskip("transformers")
    with Observer(roots=[]) as obs:
        transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                       gradient_accumulation_steps=steps, report_to=[])
        assert obs.declared_k.get("transformers") == declared


@pytest.mark.parametrize(("steps", "declared"), [(1, None), (4, 4)])
def test_accelerate_declares_k_only_above_its_default(steps: int, declared: int | None
                                                      ) -> None:
    """A plain ``Accelerator()`` (used for device placement and DDP) with a hand-written
    K-loop around ``accelerator.backward`` declares nothing: its default 1 is not the
    loop's K (watch then reads K from the script or the windows)."""
    accelerate = pytest.importorskip("accelerate")
    model = torch.nn.Linear(4, 1)
    with Observer(roots=[model]) as obs:
        acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=steps)
        acc.backward(model(torch.ones(2, 4)).sum())
        assert obs.declared_k.get("accelerate") == declared

