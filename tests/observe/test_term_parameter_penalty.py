"""A penalty on the parameters added to every micro-step's loss and never divided by K, while
the data loss beside it is (blind round 76 c_b02: ``mse / K + l2 * sum(w.pow(2).sum() ...)``,
missed before): accumulation sums K copies of its gradient, K times its coefficient where
the large batch adds it once: LOSS_SCALE. The correct forms (the penalty inside the /K, the
penalty once per window, a coefficient that may hold the 1/K) and a gradient penalty on the
inputs (it reaches the data) say nothing at error level. Recorded in-process (the run bit
for bit the plain one), judged on the recorded windows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, L2 = 4, 3, 2e-3


@pytest.fixture(autouse=True)
def _every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record every window (the loss record's budget samples a toy's windows by timing)."""
    import accumguard.observe._losses as losses

    monkeypatch.setattr(losses, "_ALWAYS", 1000)


def _penalty(model: torch.nn.Module) -> torch.Tensor:
    return sum(w.pow(2).sum() for n, w in model.named_parameters() if "weight" in n)  # type: ignore[return-value]


def _loop(form: str) -> Callable[[], list[torch.Tensor]]:
    def loop() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.SiLU(), torch.nn.Linear(16, 2))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            for i in range(K):
                x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
                if form == "gradient penalty":
                    x.requires_grad_(True)
                mse = F.mse_loss(model(x), y)
                if form == "penalty after /K":  # the bug
                    loss = mse / K + L2 * _penalty(model)
                elif form == "(mse + penalty) / K":
                    loss = (mse + L2 * _penalty(model)) / K
                elif form == "once per window":
                    loss = mse / K + (L2 * _penalty(model) if i == K - 1 else 0.0)
                elif form == "coefficient holding 1/K":
                    loss = mse / K + (0.01 / K) * _penalty(model)
                else:  # "gradient penalty" on the inputs: it reaches the data
                    gx, = torch.autograd.grad(mse, x, create_graph=True)
                    loss = mse / K + L2 * gx.pow(2).sum()
                loss.backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    return loop


def _errors(tmp_path: Path, form: str) -> list[Finding]:
    plain = _loop(form)()
    with recording(tmp_path):
        seen = _loop(form)()
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.severity == "error"]


def test_a_penalty_on_the_parameters_after_the_division_by_k_is_an_error(tmp_path: Path) -> None:
    (f,) = _errors(tmp_path, "penalty after /K")
    assert f.cls == "LOSS_SCALE", f
    assert f.title == f"a penalty on the parameters is not divided by K: it weighs {K}x its coefficient"
    assert f"times {L2:.4g}" in f.evidence and f"{K} x {L2:.4g} = {K * L2:.4g}" in f.evidence


@pytest.mark.parametrize("form", ["(mse + penalty) / K", "once per window",
                                  "coefficient holding 1/K", "gradient penalty"])
def test_correct_or_undecidable_forms_say_nothing(tmp_path: Path, form: str) -> None:
    assert _errors(tmp_path, form) == []
