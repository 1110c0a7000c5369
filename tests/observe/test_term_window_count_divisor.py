"""A second loss term divided by a count of the whole window that changes from window to
window (a masked regression over the window's labelled targets: 5 in one window, 6 in the
next, beside micro-batches of 5 rows) is normalised like the large batch: silent, though
one window's count equals the rows and the next one's reads as the 5 shifted positions of a
6-token sequence (blind round 71 c_c02, a false LOSS_SCALE before). The same term divided
by the micro-batch's rows, not by K, is still the error; the run's update is compared with
the large batch's for each form."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, B, D, C, STEPS = 3, 5, 6, 4, 3
# labelled targets per window: equal to the rows, then one more (a count every window of
# which reads as a mean over rows or shifted positions)
LABELLED = (5, 6, 5)


def _windows() -> list[list[tuple[torch.Tensor, ...]]]:
    g = torch.Generator().manual_seed(7)
    out = []
    for n in LABELLED:
        mask = torch.zeros(K * B, dtype=torch.bool)
        mask[torch.randperm(K * B, generator=g)[:n]] = True
        out.append([(torch.randn(B, D, generator=g), torch.randint(0, C, (B,), generator=g),
                     torch.randn(B, generator=g), mask[m * B:(m + 1) * B]) for m in range(K)])
    return out


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(D, 8)
        self.cls = torch.nn.Linear(8, C)
        self.reg = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.trunk(x))
        return self.cls(h), self.reg(h).squeeze(-1)


def _train(form: str, out: Path | None) -> torch.Tensor:
    torch.manual_seed(0)
    model = _Net() if out is not None else _Net().double()
    start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    with recording(out) if out is not None else _null():
        for window in _windows():
            if out is None:  # the large batch, in one backward
                batches = [tuple(torch.cat([b[i] for b in window]) for i in range(4))]
            else:
                batches = window
            n_cls = sum(b[0].shape[0] for b in window)
            n_reg = max(1, sum(int(b[3].sum()) for b in window))
            for x, y, r, m in batches:
                logits, pred = model(x.to(start.dtype))
                l_cls = F.cross_entropy(logits, y, reduction="sum")
                l_reg = ((pred - r.to(start.dtype)) ** 2 * m.to(start.dtype)).sum()
                reg = l_reg / x.shape[0] if form == "bug" else l_reg / n_reg
                (l_cls / n_cls + 0.5 * reg).backward()
            opt.step()
            opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - start


class _null:  # noqa: N801 - a context manager standing in for recording()
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("form", ["ok", "bug"])
def test_a_term_over_the_windows_changing_count(tmp_path: Path, form: str) -> None:
    update = _train(form, tmp_path)
    ref = _train("ok", None)
    err = float((update.double() - ref).norm() / ref.norm())
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    errors = [f for f in findings if f.severity == "error"]
    if form == "ok":
        assert err < 1e-5
        assert errors == []
    else:
        assert err > 0.05
        assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
        assert "not divided by K" in errors[0].title
