"""A short window in the middle of a run whose loss was divided by K (weight n/K while the
full windows weigh 1): recorded in-process as ``watch`` records it and judged by the CLI's
function. The resume that restarts at the saved micro-batch (one window of 1) is F13; short
windows that recur (epochs' ends of a loop that reads no DataLoader) are F7; the same loops
normalising a short window by its own size are silent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from accumguard.watch import recording
from accumguard.watch._report import judge

K = 4


@pytest.fixture(autouse=True)
def _every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record every window's loss (the loss record samples a toy's windows by timing)."""
    import accumguard.observe._losses as losses

    monkeypatch.setattr(losses, "_ALWAYS", 1000)


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)) for _ in range(64)]


def _resumed(out: Path, *, restart_after_saved: bool) -> None:
    """Three steps, a checkpoint of the last micro-batch index, three more steps from it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = _data()

    def run(i: int, step: int, stop: int) -> tuple[int, int]:
        last = i
        while step < stop:
            x, y = data[i]
            (F.mse_loss(model(x), y) / K).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
                step += 1
                last = i
            i += 1
        return last, step

    with recording(out) as obs:
        obs.budget = None  # every window's loss recorded (a toy loop is under any budget)
        saved, step = run(0, 0, 3)
        run(saved + 1 if restart_after_saved else saved, step, 6)


def _epochs(out: Path, *, own_size: bool) -> None:
    """Three epochs of 10 micro-batches held in a list (no DataLoader), K = 4, then one of
    8: each of the first three ends on a window of 2, divided by K (bug) or by its own
    size; the run's last window is whole."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _data()[:10]
    with recording(out) as obs:
        obs.budget = None
        for epoch in range(4):  # the last pass holds 8: the run ends on a full window
            for i, (x, y) in enumerate(batches if epoch < 3 else batches[:8]):
                start = i - i % K
                size = len(batches) if epoch < 3 else 8
                n = min(K, size - start) if own_size else K
                (F.mse_loss(model(x), y) / n).backward()
                if (i + 1) % K == 0 or i + 1 == size:
                    opt.step()
                    opt.zero_grad()


def test_resume_at_the_saved_micro_batch_is_f13(tmp_path: Path) -> None:
    _resumed(tmp_path / "bug", restart_after_saved=False)
    res = judge(tmp_path / "bug", accumulation_steps=K)
    assert [f.cls for f in res.errors] == ["F13"], [f.evidence for f in res.findings]
    assert "had 1 of K = 4 micro-steps" in res.errors[0].evidence
    assert "0.25x its mean gradient" in res.errors[0].evidence
    _resumed(tmp_path / "ok", restart_after_saved=True)
    ok = judge(tmp_path / "ok", accumulation_steps=K)
    assert not ok.findings, [f.evidence for f in ok.findings]


def test_recurring_short_windows_divided_by_k_are_f7(tmp_path: Path) -> None:
    _epochs(tmp_path / "bug", own_size=False)
    res = judge(tmp_path / "bug", accumulation_steps=K)
    assert "F7" in [f.cls for f in res.errors], [f.evidence for f in res.findings]
    f7 = next(f for f in res.errors if f.cls == "F7")
    assert "in the middle of the run" in f7.evidence and "(3 such windows)" in f7.evidence
    assert "F13" not in [f.cls for f in res.findings]
    _epochs(tmp_path / "ok", own_size=True)
    ok = judge(tmp_path / "ok", accumulation_steps=K)
    assert not ok.errors, [f.evidence for f in ok.errors]
