"""An epoch's short last window divided by K (F7) in two shapes blind round 29 missed:

* two optimizers over disjoint parameters stepping at the same boundary, and a last window
  of one micro-batch (c_b03, an MAE-style loop with an encoder and a decoder optimizer):
  the second optimizer's step, with no loss call of its own, must not make the loss record
  forget that the windows before held several micro-steps;
* a loss of several terms (a contrastive CE pair plus 0.5 x a reconstruction MSE, a_b03):
  every full window weighs the sum of the coefficients (1.5), not 1, and the short window
  divided by K weighs n/K of that."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, BATCHES = 4, 9  # two full windows and a tail of one micro-batch per epoch


@pytest.fixture(autouse=True)
def _every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    import accumguard.observe._losses as losses

    monkeypatch.setattr(losses, "_ALWAYS", 1000)


def _loop(tail_by_own_size: bool) -> None:
    torch.manual_seed(0)
    enc, dec = torch.nn.Linear(6, 3), torch.nn.Linear(3, 6)
    opts = [torch.optim.Adam(enc.parameters(), lr=1e-2), torch.optim.SGD(dec.parameters(), lr=0.1)]
    g = torch.Generator().manual_seed(2)
    data = [torch.randn(5, 6, generator=g) for _ in range(BATCHES)]
    for _ in range(2):
        for i, x in enumerate(data):
            size = min(K, BATCHES - i // K * K) if tail_by_own_size else K
            (F.mse_loss(dec(enc(x)), x) / size).backward()
            if (i + 1) % K == 0 or i + 1 == BATCHES:
                for o in opts:
                    o.step()
                for o in opts:
                    o.zero_grad()


def _errors(tmp_path: Path, tail_by_own_size: bool) -> list[Finding]:
    with recording(tmp_path):
        _loop(tail_by_own_size)
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.severity == "error"]


def test_a_one_micro_batch_tail_divided_by_k_is_f7_with_two_optimizers(tmp_path: Path) -> None:
    found = _errors(tmp_path, tail_by_own_size=False)
    assert [f.cls for f in found] == ["F7"], found
    assert "1 of K = 4 micro-steps" in found[0].evidence, found[0].evidence


def test_the_tail_divided_by_its_own_size_is_silent(tmp_path: Path) -> None:
    assert _errors(tmp_path, tail_by_own_size=True) == []


def _terms_loop(tail_by_own_size: bool) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(6, 6)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(4)
    data = [torch.randn(5, 6, generator=g) for _ in range(7)]  # windows of 4 and 3
    for _ in range(2):
        for i, x in enumerate(data):
            out = net(x)
            loss = F.cross_entropy(out, torch.arange(5)) + 0.5 * F.mse_loss(out, x)
            size = min(K, 7 - i // K * K) if tail_by_own_size else K
            (loss / size).backward()
            if (i + 1) % K == 0 or i + 1 == 7:
                opt.step()
                opt.zero_grad()


def test_a_tail_divided_by_k_is_f7_with_a_loss_of_several_terms(tmp_path: Path) -> None:
    with recording(tmp_path):
        _terms_loop(tail_by_own_size=False)
    found = [f for f in analyze(load_recordings(tmp_path))[0] if f.severity == "error"]
    assert [f.cls for f in found] == ["F7"], found
    assert "= 3/4 of the 1.5 each full window carried" in found[0].evidence, found[0].evidence


def test_a_tail_divided_by_its_size_with_a_loss_of_several_terms_is_silent(tmp_path: Path) -> None:
    with recording(tmp_path):
        _terms_loop(tail_by_own_size=True)
    assert [f for f in analyze(load_recordings(tmp_path))[0] if f.severity == "error"] == []


def test_a_summed_loss_is_not_read_as_a_tail_divided_by_k(tmp_path: Path) -> None:
    """A sum over the window (no division by K): its large-batch meaning is the sum, so the
    short window's smaller total is right, never F7 (every full window weighs the same
    total, the tail n/K of it: the words must not be read as a division by K)."""
    def loop() -> None:
        torch.manual_seed(0)
        net = torch.nn.Linear(6, 6)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(4)
        data = [torch.randn(5, 6, generator=g) for _ in range(7)]
        for _ in range(2):
            for i, x in enumerate(data):
                out = net(x)
                (F.cross_entropy(out, torch.arange(5), reduction="sum")
                 + 0.5 * F.mse_loss(out, x, reduction="sum")).backward()
                if (i + 1) % K == 0 or i + 1 == 7:
                    opt.step()
                    opt.zero_grad()

    with recording(tmp_path):
        loop()
    assert [f for f in analyze(load_recordings(tmp_path))[0] if f.cls == "F7"] == []
