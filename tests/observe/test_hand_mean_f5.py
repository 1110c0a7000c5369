"""A loss built by hand as one mean over its micro-batch, divided by K, over micro-batches of
uneven sizes (blind round 107 a_b03: DPO whose collator drops over-long pairs, 1-4 pairs per
micro-batch, ``losses.mean()`` then Accelerate's / K): each micro-batch weighs the same, so a
pair of a small micro-batch weighs more than one of a large one (F5). No loss call reveals
it: it is read from the walk's ``mean`` records. The twin sums the pairs' losses and divides
by the window's pair count. Checked in one process against the full-batch reference."""

from __future__ import annotations

from pathlib import Path

import torch

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording
from tests.helpers import judge_recorded

K, STEPS = 4, 3
SIZES = [3, 1, 4, 2]  # pairs per micro-batch (after a filter), the same in every window


def test_recorded_dpo_mean_per_micro_batch_is_f5() -> None:
    errors = [f for f in judge_recorded("r107_dpo_pairs_dropped_mean_per_micro_batch")
              if f.severity == "error"]
    assert [f.cls for f in errors] == ["F5"], errors
    assert "built by hand" in errors[0].evidence and "3 / 3 / 2 / 2" in errors[0].evidence


def test_recorded_dpo_over_the_windows_pair_count_is_silent() -> None:
    found = judge_recorded("r107_dpo_pairs_sum_over_window_count")
    assert [f for f in found if f.severity == "error"] == [], found


def _data() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(8)
    return [[(torch.randn(n, 6, generator=g), torch.randn(n, 6, generator=g)) for n in SIZES]
            for _ in range(STEPS)]


def _pair_losses(model: torch.nn.Module, chosen: torch.Tensor, rejected: torch.Tensor
                 ) -> torch.Tensor:
    margin = model(chosen).squeeze(-1) - model(rejected).squeeze(-1)
    return -torch.nn.functional.logsigmoid(margin)


def _loop(window_count: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for window in _data():
        total = sum(c.shape[0] for c, _ in window)
        for chosen, rejected in window:
            losses = _pair_losses(model, chosen, rejected)
            loss = losses.sum() / total if window_count else losses.mean() / K
            loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _reference() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for window in _data():
        chosen = torch.cat([c for c, _ in window])
        rejected = torch.cat([r for _, r in window])
        _pair_losses(model, chosen, rejected).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _update_error(params: list[torch.Tensor]) -> float:
    torch.manual_seed(0)
    start = [p.detach() for p in torch.nn.Linear(6, 1).parameters()]
    ref = _reference()
    num = sum(float(((a - s) - (r - s)).norm() ** 2) for a, r, s in zip(params, ref, start, strict=True))
    den = sum(float((r - s).norm() ** 2) for r, s in zip(ref, start, strict=True))
    return (num / den) ** 0.5


def _errors(tmp_path: Path, window_count: bool) -> list[Finding]:
    with recording(tmp_path):
        _loop(window_count)
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return [f for f in findings if f.severity == "error"]


def test_a_mean_per_micro_batch_over_uneven_pairs_is_f5_and_off(tmp_path: Path) -> None:
    errors = _errors(tmp_path, window_count=False)
    assert [f.cls for f in errors] == ["F5"], errors
    assert _update_error(_loop(False)) > 0.05


def test_the_sum_over_the_windows_pair_count_is_silent_and_exact(tmp_path: Path) -> None:
    assert _errors(tmp_path, window_count=True) == []
    assert _update_error(_loop(True)) < 1e-5
