"""A loss that is one mean over the micro-batch's tokens of a sum of per-token terms,
``(nll + c * z).mean()`` (an HF Trainer compute_loss adding a z-loss, blind round 71 a_b01),
is that loss call's normalisation as a whole: not divided by K it is LOSS_SCALE (K times the
large batch's gradient), divided by K twice it is the error the other way, divided once it
is silent. A term with a mean of its own over other rows is not read this way. Each form's
update is compared with the large batch's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, B, T, V, STEPS = 3, 2, 6, 11, 3


def _batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(4)
    return [[(torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g))
             for _ in range(K)] for _ in range(STEPS)]


def _per_token(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x).reshape(-1, V)
    nll = F.nll_loss(F.log_softmax(logits, -1), y.reshape(-1), reduction="none")
    return nll + 1e-2 * torch.logsumexp(logits, -1) ** 2


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(V, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, V)).to(dtype)


def _run(form: str, out: Path) -> torch.Tensor:
    model = _model(torch.float32)
    start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    div = {"bug": 1, "ok": K, "twice": K * K}[form]
    with recording(out):
        for window in _batches():
            for x, y in window:
                (_per_token(model, x, y).mean() / div).backward()
            opt.step()
            opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - start


def _reference() -> torch.Tensor:
    model = _model(torch.float64)
    start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for window in _batches():
        x = torch.cat([b[0] for b in window])
        y = torch.cat([b[1] for b in window])
        _per_token(model, x, y).mean().backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - start


@pytest.mark.parametrize(("form", "title"), [
    ("bug", "the loss is not divided by K"), ("twice", "the loss is divided by K twice"),
    ("ok", None)])
def test_one_mean_over_a_sum_of_per_token_terms(tmp_path: Path, form: str,
                                                title: str | None) -> None:
    update = _run(form, tmp_path)
    ref = _reference()
    err = float((update.double() - ref).norm() / ref.norm())
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    errors = [f for f in findings if f.severity == "error"]
    if title is None:
        assert err < 1e-5
        assert errors == []
        return
    assert err > 0.1
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    assert errors[0].title.startswith(title), errors[0].title
    assert "LogsumexpBackward0" in errors[0].evidence or "PowBackward0" in errors[0].evidence
