"""The framework callbacks never break or change the training they check: an internal
error of accumguard (injected into the probe's hook, or raised by a callback method)
switches the checks off and the training ends bit-identical to the unchecked one; a
deliberate error (a bad argument) still reaches the user."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from accumguard.core.errors import ConfigError
from accumguard.integrations._checks import safe_callback
from accumguard.observe._failsafe import ENV_FAULT


def test_a_callback_method_never_raises_an_internal_error() -> None:
    class Callback:
        checks = None

        @safe_callback
        def on_step_end(self) -> str:
            raise KeyError("accumguard's own bug")

        @safe_callback
        def on_train_begin(self) -> str:
            raise ConfigError("needs the Trainer's optimizer")

    assert Callback().on_step_end() is None
    with pytest.raises(ConfigError):
        Callback().on_train_begin()


def _hf_train(callback: Any, logging: str = "no", extra: Any = None) -> list[torch.Tensor]:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50,
                                       n_positions=16))
    g = torch.Generator().manual_seed(50)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 50, (24, 8), generator=g)]
    args = TrainingArguments(output_dir="unused-hf-out", per_device_train_batch_size=2,
                             gradient_accumulation_steps=4, max_steps=3, learning_rate=1e-2,
                             report_to=[], save_strategy="no", use_cpu=True, seed=0,
                             logging_strategy=logging, logging_steps=1)
    callbacks = [c for c in (callback, extra) if c is not None]
    Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks or None).train()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("fault", ["hook:_on_forward@3", "hook:_on_grad@2",
                                   "Module.zero_grad:post@2", "hook:_ledger_step@2"])
def test_hf_trainer_callback_failing_inside_changes_nothing(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    pytest.importorskip("transformers")
    from accumguard.integrations.transformers import AccumguardCallback

    monkeypatch.chdir(tmp_path)
    plain = _hf_train(None)
    clean = AccumguardCallback(every_n_steps=1)
    _hf_train(clean)
    monkeypatch.setenv(ENV_FAULT, fault)
    callback = AccumguardCallback(every_n_steps=1)
    checked = _hf_train(callback)
    assert all(torch.equal(a, b) for a, b in zip(plain, checked, strict=True))
    # no claim the clean run does not make (GPT2LMHeadModel: transformers counts position 0
    # of every row in num_items_in_batch, a uniform 7/8 the clean run reports too), and
    # none after the failure
    said = [(f.step, f.class_id) for f in callback.findings]
    assert said == [(f.step, f.class_id) for f in clean.findings][: len(said)]
    assert len(said) < len(clean.findings) or not clean.findings


def test_hf_log_figures_failing_inside_changes_nothing(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The wrapper that adds the callback's figures to the Trainer's logs runs behind the
    patch door: a fault in it leaves the logs dispatched (without the figures) and the
    training unchanged."""
    pytest.importorskip("transformers")
    from transformers import TrainerCallback

    from accumguard.integrations.transformers import AccumguardCallback

    class Logs(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict[str, Any]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kw: Any) -> None:
            self.logs.append(dict(logs or {}))

    monkeypatch.chdir(tmp_path)
    plain = _hf_train(None, logging="steps")
    clean, clean_logs = AccumguardCallback(every_n_steps=1), Logs()
    _hf_train(clean, logging="steps", extra=clean_logs)
    assert any("accumguard/backwards" in r for r in clean_logs.logs)
    monkeypatch.setenv(ENV_FAULT, "CallbackHandler.on_log@2")
    callback, logs = AccumguardCallback(every_n_steps=1), Logs()
    checked = _hf_train(callback, logging="steps", extra=logs)
    assert all(torch.equal(a, b) for a, b in zip(plain, checked, strict=True))
    assert len(logs.logs) == len(clean_logs.logs)  # every log still dispatched
    assert "internal error in CallbackHandler.on_log" in capfd.readouterr().err
    assert "accumguard/backwards" in logs.logs[0]  # before the fault
    assert not any("accumguard/backwards" in r for r in logs.logs[1:])  # off from there on
