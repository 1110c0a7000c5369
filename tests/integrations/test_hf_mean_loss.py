"""The fact behind lint's AG155, measured on the real library: the stock HF Trainer (5.x)
with gradient accumulation over ``BertForSequenceClassification`` (forward takes
``**kwargs``, loss ``CrossEntropyLoss()``'s mean) does not divide the loss by K, so one
optimizer step of SGD moves the weights K times as far as the large batch's step; both fixes
AG155 names give the large batch's update. Recorded under ``watch``, the plain run is an
error too."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from accumguard.watch import judge, recording

K = 2
B = 4


def _rows() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [{"input_ids": torch.randint(0, 50, (6,), generator=g), "labels": torch.tensor(i % 3)}
            for i in range(K * B)]


def _update(ga: int, bs: int, *, no_loss_kwargs: bool = False,
            loss_func: Callable[..., torch.Tensor] | None = None, record: Path | None = None
            ) -> torch.Tensor:
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, num_labels=3, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg)
    if no_loss_kwargs:
        model.accepts_loss_kwargs = False
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=bs,
                                 gradient_accumulation_steps=ga, max_steps=1, learning_rate=0.1,
                                 optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
                                 weight_decay=0.0, use_cpu=True, report_to=[], save_strategy="no",
                                 disable_tqdm=True, train_sampling_strategy="sequential", seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=_rows(), compute_loss_func=loss_func)
        if record is None:
            trainer.train()
        else:
            with recording(record):
                trainer.train()
    return torch.cat([p.detach().flatten() for p in model.parameters()]) - before


def _sum_over_window(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(outputs.logits, labels, reduction="sum")
    return loss / num_items_in_batch


def test_the_stock_trainer_leaves_a_plain_mean_loss_k_times_too_large(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    large = _update(1, K * B)
    plain = _update(K, B, record=tmp_path / "plain")
    assert ((plain - K * large).norm() / (K * large).norm()).item() < 1e-4
    for fixed in (_update(K, B, no_loss_kwargs=True), _update(K, B, loss_func=_sum_over_window)):
        assert ((fixed - large).norm() / large.norm()).item() < 1e-5
    errors = [f for f in judge(tmp_path / "plain").findings if f.severity == "error"]
    assert errors, "watch should report the K-fold loss"
