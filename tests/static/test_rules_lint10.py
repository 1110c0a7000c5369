"""AG124 in PyTorch Lightning: a ``configure_optimizers`` that sizes a step-interval schedule
from the batches per epoch while ``Trainer(accumulate_grad_batches=K > 1)`` steps it once per
optimizer step, against the correct twins (``estimated_stepping_batches``, the count divided
by K, an epoch interval, K = 1 or no accumulation, a horizon that is not a batch count)."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_MODULE = """
import math
import pytorch_lightning as pl
import torch
from transformers import get_linear_schedule_with_warmup

EPOCHS = 10
ACC = {k}


class LitClassifier(pl.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=3e-4)
{body}


trainer = pl.Trainer(max_epochs=EPOCHS{trainer})
"""

_STEP = 'return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}'
_LAMBDA = "sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / total))"


def _src(body: str, trainer: str = ", accumulate_grad_batches=ACC", k: int = 4) -> str:
    return _MODULE.format(k=k, body=textwrap.indent(textwrap.dedent(body).strip(), " " * 8), trainer=trainer)


def _ag124(src: str) -> list[str]:
    return [f.message for f in lint_source(src) if f.code == "AG124" and f.severity.value == "error"]


_BUGS = {
    "lambda over total": f"""
        total = self.trainer.max_epochs * len(self.train_dataloader())
        {_LAMBDA}
        {_STEP}""",
    "cosine over num_training_batches": """
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS * self.trainer.num_training_batches)
        return [opt], [{"scheduler": sched, "interval": "step"}]""",
    "onecycle over the trainer's loader": f"""
        steps = len(self.trainer.train_dataloader) * self.trainer.max_epochs
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps)
        {_STEP}""",
    "hf warmup over a datamodule loader": f"""
        total = len(self.trainer.datamodule.train_dataloader()) * EPOCHS
        sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=100, num_training_steps=total)
        {_STEP}""",
    "a local def closing over total": f"""
        total = len(self.train_dataloader()) * self.trainer.max_epochs
        warmup = int(0.1 * total)
        def lr_lambda(step):
            if step < warmup:
                return step / max(1, warmup)
            return max(0.0, (total - step) / max(1, total - warmup))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        {_STEP}""",
    "the entry through dict() and a loader name": """
        loader = self.train_dataloader()
        total = len(loader) * EPOCHS
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, total)
        return {"optimizer": opt, "lr_scheduler": dict(scheduler=sched, interval="step")}""",
}


@pytest.mark.parametrize("body", _BUGS.values(), ids=list(_BUGS))
def test_a_step_schedule_sized_in_batches_is_k_times_long(body: str) -> None:
    msgs = _ag124(_src(body))
    assert len(msgs) == 1, msgs
    assert "accumulate_grad_batches=4" in msgs[0] and "4 times longer" in msgs[0]


@pytest.mark.parametrize("trainer", [", accumulate_grad_batches=8", ", accumulate_grad_batches=ACC"])
def test_k_is_read_from_a_literal_or_a_name(trainer: str) -> None:
    msgs = _ag124(_src(_BUGS["lambda over total"], trainer=trainer))
    want = "8" if "8" in trainer else "4"
    assert len(msgs) == 1 and f"accumulate_grad_batches={want}" in msgs[0]
    assert "`total = self.trainer.max_epochs * len(self.train_dataloader())`" in msgs[0]


def test_the_fix_names_lightnings_step_count() -> None:
    found = [f for f in lint_source(_src(_BUGS["lambda over total"])) if f.code == "AG124"]
    assert found and "estimated_stepping_batches" in (found[0].fix or "")


_OKS = {
    "estimated_stepping_batches": f"""
        total = self.trainer.estimated_stepping_batches
        {_LAMBDA}
        {_STEP}""",
    "divided by the trainer's K": f"""
        total = len(self.train_dataloader()) // self.trainer.accumulate_grad_batches * self.trainer.max_epochs
        {_LAMBDA}
        {_STEP}""",
    "divided by the K constant": f"""
        total = math.ceil(len(self.train_dataloader()) / ACC) * EPOCHS
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        {_STEP}""",
    "an epoch interval in epochs": """
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.max_epochs)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}""",
    "the default interval": """
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS * len(self.train_dataloader()))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched}}""",
    "not a batch count": f"""
        total = self.hparams.total_steps
        {_LAMBDA}
        {_STEP}""",
    "a frequency other than 1": """
        total = len(self.train_dataloader()) * EPOCHS
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 4}}""",
}


@pytest.mark.parametrize("body", _OKS.values(), ids=list(_OKS))
def test_the_correct_twins_are_silent(body: str) -> None:
    assert _ag124(_src(body)) == []


@pytest.mark.parametrize(("trainer", "k"), [(", accumulate_grad_batches=ACC", 1), ("", 4),
                                            (", accumulate_grad_batches=1", 4), (", **cfg", 4)])
def test_no_accumulation_in_sight_is_silent(trainer: str, k: int) -> None:
    assert _ag124(_src(_BUGS["lambda over total"], trainer=trainer, k=k)) == []


def test_a_second_trainer_without_accumulation_is_silent() -> None:
    src = _src(_BUGS["lambda over total"]) + "\ndebug_trainer = pl.Trainer(fast_dev_run=True)\n"
    assert _ag124(src) == []


def test_manual_optimization_is_not_lightnings_stepping() -> None:
    src = _src(_BUGS["lambda over total"]).replace(
        "        self.model = model\n", "        self.model = model\n        self.automatic_optimization = False\n")
    assert _ag124(src) == []
