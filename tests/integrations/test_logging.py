"""Findings where users look: the callbacks hand their findings and per-step figures to the
trainer's own logging, read back here from the TensorBoard event files the trainers wrote
(tensorboard's ``EventAccumulator``), one process, K = 4, uneven token counts:

* HF ``Trainer(report_to="tensorboard")``: ``train/accumguard/token_weight_error`` ~0 on the
  Trainer's own loss, and >= 5 % with ``train/accumguard/finding`` text naming F5 on a
  ``compute_loss`` returning each micro-batch's token mean; the weights equal the run's
  without the callback (the logging changes nothing).
* Lightning with ``TensorBoardLogger``: the same figures through ``LightningModule.log``, the
  finding's text through the logger's ``add_text``.
* Lightning's ``pytorch_lightning.callbacks_factory`` entry point: ``ACCUMGUARD_LIGHTNING=1``
  adds the callback to a Trainer built by an unmodified script; without it nothing is added.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fw_common as fw  # noqa: E402

K = 4
ROOT = Path(__file__).resolve().parents[2]


def _events(logdir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(logdir.rglob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file under {logdir}"
    accs = []
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        accs.append(acc)
    return accs


def _scalars(accs: list[Any], tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for a in accs if tag in a.Tags()["scalars"] for e in a.Scalars(tag)]


def _texts(accs: list[Any], tag: str) -> list[str]:
    out = []
    for a in accs:
        for t in a.Tags()["tensors"]:
            if t.startswith(tag):
                out += [b.decode() for e in a.Tensors(t) for b in e.tensor_proto.string_val]
    return out


def _lm_samples(n: int = 32) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        ids = torch.randint(0, fw.VOCAB, (fw.SEQ,), generator=g)
        labels = ids.clone()
        labels[int(torch.randint(2, fw.SEQ + 1, (1,), generator=g)):] = -100
        out.append({"input_ids": ids, "labels": labels})
    return out


def _hf_run(tmp: Path, mode: str, callback: bool = True) -> tuple[Any, list[torch.Tensor]]:
    from transformers import Trainer, TrainingArguments

    from accumguard.integrations.transformers import AccumguardCallback

    class MeanLoss(Trainer):
        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            out = model(input_ids=inputs["input_ids"])
            logits, labels = out.logits[..., :-1, :], inputs["labels"][..., 1:]
            loss = F.cross_entropy(logits.reshape(-1, fw.VOCAB), labels.reshape(-1))
            return (loss, out) if return_outputs else loss

    model = fw.tiny_gpt2(0)
    model.loss_type = "ForCausalLM"
    args = TrainingArguments(
        output_dir=str(tmp / "tb"), use_cpu=True,  # events: tb/runs/...
        per_device_train_batch_size=2, gradient_accumulation_steps=K, num_train_epochs=1,
        max_grad_norm=0.0, report_to=["tensorboard"], save_strategy="no", disable_tqdm=True,
        logging_steps=1, seed=0)
    cls = MeanLoss if mode == "mean" else Trainer
    trainer = cls(model=model, args=args, train_dataset=_lm_samples(),
                  callbacks=[AccumguardCallback(every_n_steps=1)] if callback else None)
    trainer.train()
    return trainer, [p.detach().clone() for p in model.parameters()]


def test_hf_trainer_figures_and_findings_reach_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    _, plain = _hf_run(tmp_path / "plain", "ok", callback=False)
    _, checked = _hf_run(tmp_path / "ok", "ok")
    assert all(torch.equal(a, b) for a, b in zip(plain, checked, strict=True))
    ok = _events(tmp_path / "ok" / "tb")
    err = _scalars(ok, "train/accumguard/token_weight_error")
    assert [s for s, _ in err] == [1, 2, 3, 4], err  # every step checked (every_n_steps=1)
    assert max(v for _, v in err) < 1e-4, err
    assert [v for _, v in _scalars(ok, "train/accumguard/backwards")] == [K] * 4
    assert max(v for _, v in _scalars(ok, "train/accumguard/conservation_error")) < 1e-4
    assert {v for _, v in _scalars(ok, "train/accumguard/findings")} == {0.0}
    assert _texts(ok, "train/accumguard/finding") == []

    _hf_run(tmp_path / "mean", "mean")
    bad = _events(tmp_path / "mean" / "tb")
    assert min(v for _, v in _scalars(bad, "train/accumguard/token_weight_error")) > 0.05
    texts = _texts(bad, "train/accumguard/finding")
    assert texts and all(t.split(": ")[1].startswith("F5 ") for t in texts), texts
    assert [v for _, v in _scalars(bad, "train/accumguard/findings")] == [1.0, 2.0, 3.0, 4.0]


def _lightning_module(loss: str) -> Any:
    import pytorch_lightning as pl

    class LM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = fw.tiny_llama(0)

        def training_step(self, batch: dict, idx: int) -> torch.Tensor:
            return fw.mean_loss(self.model, batch) if loss == "mean" else fw.sum_loss(
                self.model, batch)[0]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return LM()


def _lightning_fit(tmp: Path, loss: str, callbacks: list[Any]) -> Any:
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, accumulate_grad_batches=K,
                         logger=TensorBoardLogger(str(tmp), name="tb"), log_every_n_steps=1,
                         callbacks=callbacks, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    loader = DataLoader(fw.token_samples(32, seed=3), batch_size=2)
    trainer.fit(_lightning_module(loss), loader)
    return trainer


def test_lightning_figures_and_findings_reach_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    pytest.importorskip("tensorboard")
    from accumguard.integrations.lightning import AccumguardCallback

    _lightning_fit(tmp_path / "ok", "sum", [AccumguardCallback(exact=True, every_n_steps=1)])
    ok = _events(tmp_path / "ok")
    err = _scalars(ok, "accumguard/token_weight_error")
    assert len(err) == 4 and max(v for _, v in err) < 1e-4, err
    assert _texts(ok, "accumguard/finding") == []
    _lightning_fit(tmp_path / "mean", "mean", [AccumguardCallback(every_n_steps=1)])
    bad = _events(tmp_path / "mean")
    assert min(v for _, v in _scalars(bad, "accumguard/token_weight_error")) > 0.05
    texts = _texts(bad, "accumguard/finding")
    assert texts and all(": F5 " in t for t in texts), texts


def _factory_entry_points(group: str) -> list[EntryPoint]:
    """The entry points pyproject.toml declares for ``group`` (the installed metadata may be
    another tree's: the venv's editable install)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = re.search(rf'^\[project\.entry-points\."{re.escape(group)}"\]\n(.*?)(?:^\[|\Z)',
                        text, re.M | re.S)
    assert section, f"pyproject.toml declares no {group} entry point"
    return [EntryPoint(name, value, group) for name, value in
            re.findall(r'^(\w+) = "([^"]+)"', section.group(1), re.M)]


def test_lightning_entry_point_adds_the_callback_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pytorch_lightning")
    import pytorch_lightning as pl
    from lightning_fabric.utilities import registry

    from accumguard.integrations._lightning_entry import ENV
    from accumguard.integrations.lightning import AccumguardCallback

    group = "pytorch_lightning.callbacks_factory"
    assert _factory_entry_points(group)
    monkeypatch.setattr(registry, "entry_points", lambda group: _factory_entry_points(group))

    def ours(trainer: Any) -> list[Any]:
        return [cb for cb in trainer.callbacks if isinstance(cb, AccumguardCallback)]

    monkeypatch.delenv(ENV, raising=False)
    assert ours(pl.Trainer(accelerator="cpu", logger=False)) == []  # not asked: unchanged
    monkeypatch.setenv(ENV, "1")
    trainer = _lightning_fit(tmp_path, "mean", [])
    (cb,) = ours(trainer)
    assert cb.from_environment and not cb.exact
    assert {f.class_id for f in cb.findings} == {"F5"}
    # a script that added its own callback keeps it; the environment's steps aside
    mine = AccumguardCallback(every_n_steps=1)
    trainer = _lightning_fit(tmp_path / "2", "mean", [mine])
    assert len(ours(trainer)) == 2 and {f.class_id for f in mine.findings} == {"F5"}
    assert [cb.findings for cb in ours(trainer) if cb.from_environment] == [[]]
