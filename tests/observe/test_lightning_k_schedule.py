"""Lightning's ``GradientAccumulationScheduler`` sets K per epoch ({0: 2, 1: 4} here) and
Lightning steps at each epoch's last batch with that batch's loss still divided by K (blind
round 47, writer c). Epochs of 9 batches end in a window of 1 divided by 2, then by 4: F7,
judged against the K Lightning set for that epoch. The twin that rescales the epoch's last
window by K / its size, and a schedule whose K divide the epoch, stay silent. A real
Lightning run, observed in this process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

from helpers import recorded_failures

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.callbacks import GradientAccumulationScheduler  # noqa: E402


class _Regressor(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, rescale_tail: bool) -> None:
        super().__init__()
        self.net = torch.nn.Linear(6, 1)
        self.rescale_tail = rescale_tail

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if self.rescale_tail:  # Lightning divides by K: make the last window's divisor its size
            k = self.trainer.accumulate_grad_batches
            left = self.trainer.num_training_batches - (idx // k) * k
            loss = loss * k / min(k, left)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(tmp_path: Path, schedule: dict[int, int], *, batches: int, rescale_tail: bool,
         reference_steps: int = 0) -> list:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4 * batches, 6), torch.randn(4 * batches, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with recording(tmp_path):
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0,
                             callbacks=[GradientAccumulationScheduler(scheduling=dict(schedule))])
        trainer.fit(_Regressor(rescale_tail), loader)
        # a large-batch reference after the run, another optimizer stepping every backward:
        # its windows of one outnumber the training's, so no single K fits the run
        ref = torch.nn.Linear(6, 1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
        for _ in range(reference_steps):
            torch.nn.functional.mse_loss(ref(data.tensors[0]), data.tensors[1]).backward()
            ref_opt.step()
            ref_opt.zero_grad()
    findings, _, _ = analyze(load_recordings(tmp_path))
    return findings


def test_each_epochs_short_tail_divided_by_that_epochs_k_is_f7(tmp_path: Path) -> None:
    findings = _fit(tmp_path, {0: 2, 1: 4}, batches=9, rescale_tail=False)
    f7 = [f for f in findings if f.cls == "F7" and f.severity.value == "error"]
    assert f7, findings
    assert "so its update is 1/2 of its mean gradient" in f7[0].evidence


def test_the_tail_is_judged_by_its_epochs_k_when_no_single_k_fits_the_run(tmp_path: Path) -> None:
    findings = _fit(tmp_path, {0: 2, 1: 4}, batches=9, rescale_tail=False, reference_steps=12)
    f7 = [f for f in findings if f.cls == "F7" and f.severity.value == "error"]
    assert f7, findings
    assert ("had 1 of the K = 2 micro-steps set for that epoch (by Lightning's "
            "GradientAccumulationScheduler)") in f7[0].evidence
    assert "so its update is 1/2 of its mean gradient" in f7[0].evidence


def test_the_rescaled_tail_with_a_reference_after_it_is_silent(tmp_path: Path) -> None:
    findings = _fit(tmp_path, {0: 2, 1: 4}, batches=9, rescale_tail=True, reference_steps=12)
    assert not [f for f in findings if f.severity.value == "error"], findings


def test_the_tail_rescaled_to_its_own_size_is_silent(tmp_path: Path) -> None:
    findings = _fit(tmp_path, {0: 2, 1: 4}, batches=9, rescale_tail=True)
    assert not [f for f in findings if f.severity.value == "error"], findings


def test_a_schedule_whose_k_divide_the_epoch_is_silent(tmp_path: Path) -> None:
    findings = _fit(tmp_path, {0: 2, 1: 4}, batches=8, rescale_tail=False)
    assert not [f for f in findings if f.severity.value == "error"], findings


@pytest.mark.parametrize("where", ["epoch_start", "pass_end"])
def test_a_fault_in_the_new_bookkeeping_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The epoch-start patch of GradientAccumulationScheduler and the pass-end check of the
    step handler, made to fail: the user's run keeps the same bits, and the failure is
    recorded as accumguard's own (never as "no finding")."""
    from accumguard.observe import _steps

    def weights(out: Path | None) -> list[torch.Tensor]:
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(36, 6), torch.randn(36, 1))
        module = _Regressor(False)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0,
                             callbacks=[GradientAccumulationScheduler(scheduling={0: 2, 1: 4})])
        if out is None:
            trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
        else:
            with recording(out):
                trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
        return [p.detach().clone() for p in module.parameters()]

    plain = weights(None)
    if where == "epoch_start":
        class Broken(list):  # type: ignore[type-arg]
            def append(self, item: object) -> None:
                raise RuntimeError("injected fault in the epoch-start patch")
        from accumguard.observe import _observer
        real_init = _observer.Observer.__init__

        def init(self: object, *a: object, **kw: object) -> None:
            real_init(self, *a, **kw)  # type: ignore[arg-type]
            self.k_changes = Broken()  # type: ignore[attr-defined]
        monkeypatch.setattr(_observer.Observer, "__init__", init)
    else:
        def broken(self: object, w: object) -> bool:
            raise RuntimeError("injected fault in the pass-end check")
        monkeypatch.setattr(_steps.StepMachinery, "_pass_end_next", broken)
    watched = weights(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    errors = recorded_failures(tmp_path)
    assert errors and "injected fault" in errors[0]["error"], errors
    assert list(load_recordings(tmp_path).failures) == [0]
