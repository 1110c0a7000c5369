"""A class-weighted ``cross_entropy`` (``weight=``) is recorded too, counted in units of
class weight: its 'mean' divides by the valid targets' weights summed (blind round 77 a_b03,
missed before: Lightning averaging K class-weighted micro-batch means, F5). The weighted mean
of each micro-batch divided by K is F5 when the micro-batches' weight sums differ; the
weighted sum over the window's weight sum, and one micro-batch of equal weight sums, say
nothing at error level. Recorded in-process (the run bit for bit the plain one), judged on
the recorded windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS = 4, 3
WEIGHT = torch.tensor([0.2, 1.0, 3.0])


@pytest.fixture(autouse=True)
def _every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record every window (the loss record's budget samples a toy's windows by timing)."""
    import accumguard.observe._losses as losses

    monkeypatch.setattr(losses, "_ALWAYS", 1000)


def _loop(form: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        window = [(torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g))
                  for _ in range(K)]
        total = sum(float(WEIGHT[y].sum()) for _, y in window)
        for x, y in window:
            if form == "mean / K":  # the bug
                loss = F.cross_entropy(model(x), y, weight=WEIGHT) / K
            else:  # the window's weighted mean
                loss = F.cross_entropy(model(x), y, weight=WEIGHT, reduction="sum") / total
            loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _errors(tmp_path: Path, form: str) -> list[Finding]:
    plain = _loop(form)
    with recording(tmp_path):
        seen = _loop(form)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.severity == "error"]


def test_class_weighted_means_of_each_micro_batch_are_f5(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "mean / K")
    assert [f.cls for f in errors] == ["F5"], errors
    assert "class-weighted token" in errors[0].evidence, errors[0].evidence


def test_the_windows_weighted_mean_is_silent(tmp_path: Path) -> None:
    assert _errors(tmp_path, "window") == []
