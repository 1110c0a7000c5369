"""Lightning on 2 gloo ranks (DDP strategy): AccumguardCallback(exact=True) with a summed
token loss equals the fp64 large-batch reference, in automatic and in manual optimisation;
Lightning's default (a token mean divided by accumulate_grad_batches) does not and is
flagged F5."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fw_common as fw  # noqa: E402

from accumguard.runtime.launch import run_on_ranks  # noqa: E402

pytest.importorskip("pytorch_lightning")
pytest.importorskip("transformers")

K = 4
LR = 0.3
CLIP = 0.5  # below the normalised gradient's norm: the manual_clip run's clipping is active
SAMPLES = 40  # 20 batches of 2 -> 10 per rank -> windows of 4, 4 and a partial 2


def _opt(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def _sched(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))


def _worker(rank: int, world: int) -> dict[str, Any]:
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    from accumguard.integrations.lightning import AccumguardCallback

    class LM(pl.LightningModule):
        def __init__(self, loss: str, manual: bool, clip: bool = False) -> None:
            super().__init__()
            self.model = fw.tiny_llama(0)
            self.loss = loss
            self.automatic_optimization = not manual
            self.clip = clip
            self.norms: list[float] = []

        def training_step(self, batch: dict, idx: int) -> torch.Tensor:
            if self.loss == "sum":
                loss = fw.sum_loss(self.model, batch)[0]  # the one change: sum, not mean
            else:
                loss = fw.mean_loss(self.model, batch)
            if not self.automatic_optimization:  # a manual accumulation loop
                opt, sched = self.optimizers(), self.lr_schedulers()
                self.manual_backward(loss)
                last = idx + 1 == self.trainer.num_training_batches
                if (idx + 1) % K == 0 or last:
                    if self.clip:  # the manual loop clips before its step
                        self.clip_gradients(opt, gradient_clip_val=CLIP,
                                            gradient_clip_algorithm="norm")
                        self.norms.append(float(torch.linalg.vector_norm(torch.stack(
                            [p.grad.norm() for p in self.parameters() if p.grad is not None]))))
                    opt.step()
                    sched.step()
                    opt.zero_grad()
            return loss

        def configure_optimizers(self) -> Any:
            opt = _opt(self.parameters())
            return {"optimizer": opt,
                    "lr_scheduler": {"scheduler": _sched(opt), "interval": "step"}}

    class Recorder(pl.Callback):
        def __init__(self) -> None:
            self.windows: list[list[dict]] = []
            self.snaps: list[dict] = []
            self.current: list[dict] = []
            self.step = 0

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, i: int) -> None:
            self.current.append(fw.plain(batch))

        def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any,
                               i: int) -> None:
            if trainer.global_step > self.step:
                self.step = trainer.global_step
                self.windows.append(self.current)
                self.current = []
                self.snaps.append(fw.flat_params(module.model))

    out: dict[str, Any] = {}
    for name, loss, manual, exact in [("exact", "sum", False, True),
                                      ("default", "mean", False, False),
                                      ("manual", "sum", True, True),
                                      ("manual_clip", "sum", True, True)]:
        cb = AccumguardCallback(exact=exact, accumulation_steps=K, every_n_steps=1)
        rec = Recorder()
        trainer = pl.Trainer(
            accelerator="cpu", devices=world, strategy="ddp", max_epochs=1,
            accumulate_grad_batches=1 if manual else K, callbacks=[cb, rec], logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0)
        loader = DataLoader(fw.token_samples(SAMPLES, seed=5), batch_size=2, shuffle=False)
        lm = LM(loss, manual, clip=name == "manual_clip")
        trainer.fit(lm, loader)
        out[name] = {"windows": rec.windows, "snaps": rec.snaps,
                     "findings": sorted({f.class_id for f in cb.findings}),
                     "counts": cb.window_counts,
                     "metric": float(trainer.callback_metrics["accumguard_findings"]),
                     "norms": lm.norms}
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return run_on_ranks(_worker, 2, timeout=240)


def _errors(runs: list[dict[str, Any]], mode: str) -> list[float]:
    # Lightning steps the lr scheduler (interval="step") once per optimizer step: the
    # reference does the same (and clips where the manual loop clips).
    return fw.update_errors(fw.tiny_llama(0), _opt, _sched,
                            [r[mode]["windows"] for r in runs], runs[0][mode]["snaps"],
                            max_grad_norm=CLIP if mode == "manual_clip" else None)


@pytest.mark.parametrize("mode", ["exact", "manual", "manual_clip"])
def test_exact_callback_equals_the_reference(runs: list[dict[str, Any]], mode: str) -> None:
    sizes = [len(w) for w in runs[0][mode]["windows"]]
    assert sizes == [K, K, 2], sizes  # a partial final window
    errs = _errors(runs, mode)
    assert max(errs) <= fw.EXACT_TOL, errs
    for r in runs:
        assert r[mode]["findings"] == [] and r[mode]["metric"] == 0.0, r[mode]["findings"]
        assert r[mode]["counts"] == runs[0][mode]["counts"]  # one global N per window
    if mode == "manual_clip":  # clipping was active (and the rescale did not come after it)
        assert all(abs(n - CLIP) < 1e-4 for n in runs[0][mode]["norms"]), runs[0][mode]["norms"]


def test_lightning_default_token_mean_differs_and_is_flagged(
        runs: list[dict[str, Any]]) -> None:
    errs = _errors(runs, "default")
    assert max(errs) >= fw.BROKEN_MIN, errs
    for r in runs:
        assert r["default"]["findings"] == ["F5"], r["default"]["findings"]
        assert r["default"]["metric"] >= 1.0
