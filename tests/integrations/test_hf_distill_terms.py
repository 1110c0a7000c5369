"""The stock HF Trainer with a distillation ``compute_loss`` (a tiny Llama student and
teacher from configs), K = 4, recorded as ``accumguard watch`` records it.

The student's CE goes through the model with ``num_items_in_batch`` (the window's token
mean: the Trainer then does not divide by K) under a coefficient ``alpha``; the KD term is
``(1 - alpha) * T^2 * kl`` per valid token. Averaged over the micro-batch's own tokens
(``.mean()``) it weighs K x its coefficient over the window: LOSS_SCALE naming K. Summed and
divided by ``num_items_in_batch`` like the CE it is the large batch's term: silent. The main
loss carrying a coefficient of its own, equal to the KD term's at alpha = 0.5, is what the
term rule has to read (blind round 40 a_b01).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fw_common as fw  # noqa: E402

from accumguard.demo._fw_models import hf_samples  # noqa: E402
from accumguard.watch import judge, recording  # noqa: E402

K = 4
ALPHA = 0.5
TEMP = 2.0


def _train(out: Path, window_kd: bool) -> dict[str, torch.Tensor]:
    from transformers import Trainer, TrainingArguments

    class Distill(Trainer):
        def __init__(self, *args: Any, teacher: torch.nn.Module, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.teacher = teacher.eval().requires_grad_(False)

        def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor],
                         return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
            outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
            with torch.no_grad():
                t_logits = self.teacher(input_ids=inputs["input_ids"]).logits
            valid = inputs["labels"][:, 1:] != fw.IGNORE
            kl = F.kl_div(F.log_softmax(outputs.logits[:, :-1] / TEMP, -1),
                          F.log_softmax(t_logits[:, :-1] / TEMP, -1), log_target=True,
                          reduction="none").sum(-1)[valid] * TEMP ** 2
            kd = kl.sum() / num_items_in_batch if window_kd else kl.mean()
            loss = ALPHA * outputs.loss + (1.0 - ALPHA) * kd
            return (loss, outputs) if return_outputs else loss

    torch.manual_seed(0)
    student, teacher = fw.tiny_llama(0), fw.tiny_llama(1)
    rows = hf_samples(4 * K, seed=5)

    def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {key: torch.stack([b[key] for b in batch]) for key in batch[0]}

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=2,
                                 gradient_accumulation_steps=K, max_steps=2,
                                 learning_rate=1e-3, logging_steps=10_000, save_strategy="no",
                                 report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
        trainer = Distill(model=student, args=args, train_dataset=rows, data_collator=collate,
                          teacher=teacher)
        with recording(out):
            trainer.train()
    return {n: p.detach().clone() for n, p in student.named_parameters()}


def _errors(out: Path) -> list[Any]:
    return [f for f in judge(out).findings if f.severity == "error"]


def test_a_kd_term_averaged_per_micro_batch_is_loss_scale(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _train(tmp_path / "bug", window_kd=False)
    (f,) = _errors(tmp_path / "bug")
    assert f.cls == "LOSS_SCALE" and f"weighs {K}x its coefficient" in f.title, f
    assert f"weighs its tokens {ALPHA:g} in total" in f.evidence, f.evidence
    assert "num_items_in_batch" in f.fix and "all-reduced" not in f.fix, f.fix


def test_a_kd_term_over_num_items_in_batch_is_silent(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _train(tmp_path / "fixed", window_kd=True)
    assert _errors(tmp_path / "fixed") == []
