"""The HF Trainer callback under label smoothing (``label_smoothing_factor=0.1``), single
process, a tiny GPT-2 from a config, ``gradient_accumulation_steps=4`` over uneven token
counts. Label smoothing changes each token's logits gradient (``s·(p − (1−eps)·onehot −
eps/V)``) but not its weight ``s``: the probe reads ``s`` through the smoothed form, so the
Trainer's own loss (the label smoother divided by ``num_items_in_batch``) is silent and the
same loss with no window count (a per-micro-batch token mean, then / K: the Trainer with a
model whose ``accepts_loss_kwargs`` is False, or a ``compute_loss`` that drops the count)
is F5, with no "not a cross-entropy" line."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fw_common as fw  # noqa: E402

pytest.importorskip("transformers")

K = 4


def _data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(4 * K):
        ids = torch.randint(0, fw.VOCAB, (fw.SEQ,), generator=g)
        labels = ids.clone()
        labels[int(torch.randint(2, fw.SEQ + 1, (1,), generator=g)):] = -100
        out.append({"input_ids": ids, "labels": labels})
    return out


def _train(mode: str, caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[str]]:
    """``mode``: ``default`` (the Trainer's label smoother with the window's count),
    ``per_micro`` (the same smoother given no count: each micro-batch's own token mean)."""
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_pt_utils import LabelSmoother

    from accumguard.integrations.transformers import AccumguardCallback

    class PerMicro(Trainer):
        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            labels = inputs.pop("labels")
            out = model(**inputs)
            smoother = LabelSmoother(epsilon=self.args.label_smoothing_factor)
            loss = smoother(out, labels, shift_labels=True)  # no num_items_in_batch
            return (loss, out) if return_outputs else loss

    class Counting(AccumguardCallback):
        checked = 0

        def on_train_end(self, *a: Any, **kw: Any) -> None:
            self.checked = self.checks.checked_steps if self.checks is not None else -1
            super().on_train_end(*a, **kw)

    caplog.set_level(logging.INFO, "accumguard")
    model = fw.tiny_gpt2(0)
    model.loss_type = "ForCausalLM"
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="accumguard-hf-ls-"), use_cpu=True,
        per_device_train_batch_size=2, gradient_accumulation_steps=K, num_train_epochs=1,
        max_grad_norm=0.0, report_to="none", save_strategy="no", disable_tqdm=True,
        label_smoothing_factor=0.1, learning_rate=0.1, seed=0)
    cb = Counting(every_n_steps=1)
    cls = PerMicro if mode == "per_micro" else Trainer
    trainer = cls(model=model, args=args, train_dataset=_data(), callbacks=[cb])
    trainer.train()
    assert cb.checked >= 2, cb.checked  # every window judged
    found = sorted({f["class_id"] for f in trainer.state.accumguard_findings})
    return found, [r.getMessage() for r in caplog.records]


def test_label_smoothing_default_loss_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    found, lines = _train("default", caplog)
    assert found == [], found
    assert not any("not that of a token cross-entropy" in s for s in lines), lines


def test_label_smoothing_per_micro_batch_mean_is_f5(caplog: pytest.LogCaptureFixture
                                                   ) -> None:
    found, lines = _train("per_micro", caplog)
    assert found == ["F5"], found
    assert not any("not that of a token cross-entropy" in s for s in lines), lines
