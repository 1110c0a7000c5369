"""Two optimizers sharing one GradScaler, ``scaler.unscale_`` called for one of them before
a clip over all the parameters (blind round 107 b_b01): the other optimizer's gradients
enter the clip's norm times the loss scale, and the clip shrinks every gradient by a factor
the window's real norm would not give (F8). Checked against a single-process reference on
the full batch (clipped once, unscaled): the twin that unscales both optimizers first is
the reference's update; the bug is not. The reading runs in the clip's door: a fault there
changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accumguard.observe import _patch_torch
from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, MAX_NORM = 2, 4, 0.5


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(4)
    return [[(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(K)]
            for _ in range(STEPS)]


def _opts(model: torch.nn.Sequential) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    return (torch.optim.SGD(model[0].parameters(), lr=0.1),
            torch.optim.SGD(model[2].parameters(), lr=0.1))


def _loop(unscale_both: bool) -> list[torch.Tensor]:
    model = _model()
    body, head = _opts(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for window in _batches():
        for x, y in window:
            scaler.scale((model(x) - y).pow(2).mean() / K).backward()
        scaler.unscale_(body)
        if unscale_both:
            scaler.unscale_(head)
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        scaler.step(body)
        scaler.step(head)
        scaler.update()
        body.zero_grad()
        head.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _reference() -> list[torch.Tensor]:
    model = _model()
    opts = _opts(model)
    for window in _batches():
        x = torch.cat([b[0] for b in window])
        y = torch.cat([b[1] for b in window])
        (model(x) - y).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _update_error(params: list[torch.Tensor]) -> float:
    start = [p.detach() for p in _model().parameters()]
    ref = _reference()
    num = sum(float(((a - s) - (r - s)).norm() ** 2) for a, r, s in zip(params, ref, start, strict=True))
    den = sum(float((r - s).norm() ** 2) for r, s in zip(ref, start, strict=True))
    return (num / den) ** 0.5


def _errors(tmp_path: Path, unscale_both: bool) -> list[Finding]:
    plain = _loop(unscale_both)
    with recording(tmp_path):
        seen = _loop(unscale_both)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return [f for f in findings if f.severity == "error"]


def test_a_clip_after_unscaling_one_of_two_optimizers_is_f8(tmp_path: Path) -> None:
    errors = _errors(tmp_path, unscale_both=False)
    assert [f.cls for f in errors] == ["F8"], errors
    assert "still held their gradient times the loss scale 1024" in errors[0].evidence
    assert _update_error(_loop(False)) > 0.05


def test_unscaling_every_optimizer_first_is_silent_and_the_large_batch(tmp_path: Path) -> None:
    assert _errors(tmp_path, unscale_both=True) == []
    assert _update_error(_loop(True)) < 1e-5


def test_a_fault_reading_the_scalers_state_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _loop(False)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected into _partly_scaled")

    monkeypatch.setattr(_patch_torch, "_partly_scaled", broken)
    with recording(tmp_path) as obs:
        params = _loop(False)
        failure = obs.failure
    assert failure is not None and "injected into _partly_scaled" in failure.error
    assert all(torch.equal(a, b) for a, b in zip(params, plain, strict=True))
