"""transformers Trainer, gradient_accumulation_steps=4 on 2 gloo ranks: a compute_loss override
using exact_token_loss (and the Trainer's own default loss) equals the fp64 large-batch
reference after every step, with uneven token counts across micro-steps and ranks and a
partial final window; an override returning the per-micro-batch token mean (ignoring
num_items_in_batch) does not and is flagged F5 by AccumguardCallback; a Trainer that passes
no num_items_in_batch makes exact_token_loss raise."""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fw_common as fw  # noqa: E402

from accumguard.runtime.launch import run_on_ranks  # noqa: E402

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

K = 4
LR = 0.3
SAMPLES = 40  # per-device batch 2 -> 10 micro-batches per rank -> windows 4, 4 and a partial 2


def _opt(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def _sched(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))


def _data() -> list[dict[str, torch.Tensor]]:
    """HF-style causal-LM samples: labels = input_ids with padding -100 (shifted inside)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(SAMPLES):
        ids = torch.randint(0, fw.VOCAB, (fw.SEQ,), generator=g)
        labels = ids.clone()
        labels[int(torch.randint(2, fw.SEQ + 1, (1,), generator=g)):] = -100
        out.append({"input_ids": ids, "labels": labels})
    return out


def shifted_sum_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, Any]:
    """The reference's loss: summed next-token CE over valid shifted labels, and the count."""
    logits = model(input_ids=batch["input_ids"]).logits[..., :-1, :]
    labels = batch["labels"][..., 1:]
    s = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                        ignore_index=-100, reduction="sum")
    return s, (labels != -100).sum()


def _worker(rank: int, world: int) -> dict[str, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from accumguard.core.errors import ConfigError
    from accumguard.integrations.transformers import AccumguardCallback, exact_token_loss

    class Recording(Trainer):
        """Records each micro-batch it trains on; ``mode`` picks the loss."""

        mode = "default"
        current: list[dict]

        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            self.current.append(fw.plain(inputs))
            if self.mode == "default":
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            out = model(input_ids=inputs["input_ids"])
            if self.mode == "exact":  # the one-line change
                loss = exact_token_loss(self, out.logits, inputs["labels"], num_items_in_batch)
            else:  # the 2024 bug: a per-micro-batch token mean, num_items_in_batch ignored
                logits, labels = out.logits[..., :-1, :], inputs["labels"][..., 1:]
                loss = F.cross_entropy(logits.reshape(-1, fw.VOCAB), labels.reshape(-1),
                                       ignore_index=-100)
            return (loss, out) if return_outputs else loss

    class Snapshots(TrainerCallback):
        def __init__(self, trainer: Recording) -> None:
            self.trainer = trainer
            self.windows: list[list[dict]] = []
            self.snaps: list[dict] = []

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                        **kw: Any) -> None:
            self.windows.append(self.trainer.current)
            self.trainer.current = []
            self.snaps.append(fw.flat_params(model))

    def make(mode: str, loss_type: str | None = "ForCausalLM"
             ) -> tuple[Recording, AccumguardCallback, Snapshots]:
        model = fw.tiny_gpt2(0)
        # GPT2LMHeadModel's loss_type is None: the Trainer would count every label, position
        # 0 included, while the model's loss shifts (see test_gpt2_default_token_count).
        model.loss_type = loss_type
        opt = _opt(model.parameters())
        args = TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="accumguard-hf-"), use_cpu=True,
            per_device_train_batch_size=2, gradient_accumulation_steps=K, num_train_epochs=1,
            max_grad_norm=0.0, report_to="none", save_strategy="no", disable_tqdm=True,
            logging_steps=1, seed=0)
        cb = AccumguardCallback(every_n_steps=1)
        trainer = Recording(model=model, args=args, train_dataset=_data(),
                            optimizers=(opt, _sched(opt)), callbacks=[cb])
        trainer.mode, trainer.current = mode, []
        snaps = Snapshots(trainer)
        trainer.add_callback(snaps)
        return trainer, cb, snaps

    out: dict[str, Any] = {}
    for mode in ("exact", "default", "mean", "gpt2_default"):
        trainer, cb, snaps = make("default" if mode == "gpt2_default" else mode,
                                  None if mode == "gpt2_default" else "ForCausalLM")
        trainer.train()
        logged = [r["accumguard"] for r in trainer.state.log_history if "accumguard" in r]
        out[mode] = {"windows": snaps.windows, "snaps": snaps.snaps,
                     "findings": sorted({f["class_id"] for f in trainer.state.accumguard_findings}),
                     "logged": logged}
    # No num_items_in_batch: the Trainer counts tokens only for models taking **kwargs.
    trainer, _, _ = make("exact")
    trainer.model_accepts_loss_kwargs = False
    try:
        trainer.train()
        out["missing"] = "no error"
    except ConfigError as err:
        out["missing"] = str(err)
    # The Trainer counted unshifted labels; a shifted exact loss must refuse that count.
    trainer, _, _ = make("exact", loss_type=None)
    try:
        trainer.train()
        out["shift"] = "no error"
    except ConfigError as err:
        out["shift"] = str(err)
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return run_on_ranks(_worker, 2, timeout=300)


def _errors(runs: list[dict[str, Any]], mode: str) -> list[float]:
    return fw.update_errors(fw.tiny_gpt2(0), _opt, _sched, [r[mode]["windows"] for r in runs],
                            runs[0][mode]["snaps"], loss_fn=shifted_sum_loss)


@pytest.mark.parametrize("mode", ["exact", "default"])
def test_trainer_exact_paths_equal_the_reference(runs: list[dict[str, Any]], mode: str) -> None:
    sizes = [len(w) for w in runs[0][mode]["windows"]]
    assert sizes == [K, K, 2], sizes  # a partial final window
    counts = [[int((b["labels"][..., 1:] != -100).sum()) for b in w]
              for w in runs[0][mode]["windows"]]
    assert len({c for w in counts for c in w}) > 3, counts  # uneven token counts
    errs = _errors(runs, mode)
    assert max(errs) <= fw.EXACT_TOL, errs
    for r in runs:
        assert r[mode]["findings"] == [] and r[mode]["logged"] == [], r[mode]["findings"]


def test_token_mean_override_differs_and_is_flagged_f5(runs: list[dict[str, Any]]) -> None:
    errs = _errors(runs, "mean")
    assert min(errs) >= fw.BROKEN_MIN, errs
    for r in runs:
        assert r["mean"]["findings"] == ["F5"], r["mean"]["findings"]
        assert len(r["mean"]["logged"]) == 3  # one log record per step: every step is off


def test_missing_num_items_in_batch_raises(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        assert "did not pass num_items_in_batch" in r["missing"], r["missing"]
        assert "model_accepts_loss_kwargs = True" in r["missing"]


def test_shift_mismatch_raises(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        assert "counted num_items_in_batch over all labels" in r["shift"], r["shift"]
        assert "model.loss_type = 'ForCausalLM'" in r["shift"]


def test_gpt2_default_token_count_is_flagged(runs: list[dict[str, Any]]) -> None:
    # transformers 5.24: for GPT2LMHeadModel (loss_type None) the Trainer counts
    # num_items_in_batch over all labels while the model's loss shifts them: every token
    # gets weight N_shifted/N_all < 1/N. Found by the callback; a uniform factor, so not F5.
    errs = _errors(runs, "gpt2_default")
    assert min(errs) >= fw.BROKEN_MIN, errs
    for r in runs:
        assert r["gpt2_default"]["findings"] == ["LOSS_SCALE"], r["gpt2_default"]["findings"]
