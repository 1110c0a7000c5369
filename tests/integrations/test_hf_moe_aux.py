"""The stock HF Trainer on a transformers Mixture-of-Experts model (a tiny Mixtral from a
config, ``output_router_logits=True``), K = 4, recorded as ``accumguard watch`` records it.

The model accepts loss kwargs, so the Trainer passes ``num_items_in_batch``: the CE is a sum
over the window's token count (right, no division by K), and the model adds
``router_aux_loss_coef * aux_loss`` (a per-micro-batch mean over every layer's router rows) at
each micro-step, so over a window the router term weighs K x its coefficient (transformers
5.24). ``watch`` calls it LOSS_SCALE; with the coefficient set to c / K (the fix it names) the
same run is silent.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fw_common as fw  # noqa: E402

from accumguard.demo._fw_models import hf_samples  # noqa: E402
from accumguard.watch import judge, recording  # noqa: E402

K = 4
COEF = 0.5


def _train(out: Path, coef: float) -> None:
    from transformers import MixtralConfig, MixtralForCausalLM, Trainer, TrainingArguments

    cfg = MixtralConfig(vocab_size=fw.VOCAB, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                        output_router_logits=True, router_aux_loss_coef=coef,
                        bos_token_id=0, eos_token_id=1, pad_token_id=None)
    torch.manual_seed(0)
    model = MixtralForCausalLM(cfg)
    rows = hf_samples(8 * K, seed=3)
    for r in rows:  # a mask: the router loss then divides by the count of valid rows
        r["attention_mask"] = torch.ones_like(r["input_ids"])

    def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {key: torch.stack([b[key] for b in batch]) for key in batch[0]}

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=2,
                                 gradient_accumulation_steps=K, max_steps=3,
                                 learning_rate=1e-3, logging_steps=10_000, save_strategy="no",
                                 report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collate)
        with recording(out):
            trainer.train()


def _errors(out: Path) -> list[Any]:
    result = judge(out)
    return [f for f in result.findings if f.severity == "error"]


def test_the_router_loss_added_at_every_micro_step_is_loss_scale(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _train(tmp_path / "bug", COEF)
    (f,) = _errors(tmp_path / "bug")
    assert f.cls == "LOSS_SCALE", f
    assert "router_aux_loss_coef" in f.fix and f"multiplied by {COEF:g}" in f.evidence
    _train(tmp_path / "fixed", COEF / K)  # the fix the finding names
    assert _errors(tmp_path / "fixed") == []
