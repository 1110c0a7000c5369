"""What a framework declares as K, read by the observer when the framework is constructed."""

from __future__ import annotations

import pytest

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
