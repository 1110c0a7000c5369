"""AG155: the stock HF Trainer with gradient accumulation over a model class whose loss is a
plain mean (the list generated from transformers' source) reaches the class through the
spellings scripts use, and stays silent on the fixes, on K = 1, on a class that honours
num_items_in_batch and on a Trainer that owns its loss."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accumguard.static.lint import lint_source
from accumguard.static.lint._hf_mean_loss import MEAN_LOSS_CLASSES, TRANSFORMERS_VERSION

_SRC = """
from transformers import (AutoModelForSequenceClassification, BertConfig, BertForMaskedLM,
                          LlamaConfig, LlamaForCausalLM, RobertaConfig, Trainer, TrainingArguments)
from peft import LoraConfig, get_peft_model


def build():
    cfg = BertConfig(vocab_size=64, hidden_size=32)
    return BertForMaskedLM(cfg)


{model}
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                         gradient_accumulation_steps={ga})
trainer = Trainer(model=model, args=args, train_dataset=rows{extra})
trainer.train()
"""


def _codes(model: str, ga: str = "4", extra: str = "") -> list[str]:
    src = textwrap.dedent(_SRC).replace("{model}", textwrap.dedent(model)).replace(
        "{ga}", ga).replace("{extra}", extra)
    return [f.code for f in lint_source(src) if f.code == "AG155"]


@pytest.mark.parametrize("model", [
    "model = BertForMaskedLM(BertConfig(vocab_size=64))",
    "model = build()",
    "model = AutoModelForSequenceClassification.from_config(RobertaConfig(num_labels=3))",
    "model = get_peft_model(build(), LoraConfig(r=4))",
])
def test_a_mean_loss_class_under_the_stock_trainer(model: str) -> None:
    assert _codes(model) == ["AG155"]


@pytest.mark.parametrize(("model", "ga", "extra"), [
    ("model = build()", "1", ""),
    ("model = LlamaForCausalLM(LlamaConfig())", "4", ""),
    ("model = build()", "4", ", compute_loss_func=window_sum_loss"),
    ("model = build()\nmodel.accepts_loss_kwargs = False", "4", ""),
    ("model = build()", "args_ga", ""),
])
def test_silent_on_fixes_k_one_and_honouring_classes(model: str, ga: str, extra: str) -> None:
    assert _codes(model, ga, extra) == []


def test_the_class_list_is_the_installed_libraries() -> None:
    """The list is generated from transformers' source; regenerated here, it is the same
    (skipped when another transformers version is installed: its list may differ)."""
    transformers = pytest.importorskip("transformers")
    if transformers.__version__ != TRANSFORMERS_VERSION:
        pytest.skip(f"list made from {TRANSFORMERS_VERSION}, installed {transformers.__version__}")
    script = Path(__file__).resolve().parents[2] / "scripts/hf_mean_loss_classes.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {"BertForMaskedLM", "BertForSequenceClassification"} <= MEAN_LOSS_CLASSES
    assert "LlamaForCausalLM" not in MEAN_LOSS_CLASSES
