"""A constant that equals K is not K (blind round 96 c_b03): a distillation loss keeps
Hinton's T ** 2 = 4 beside K = 4. The twin (summed KL times T ** 2, times W over the
window's all-ranks frame count) was called "loss weights total 4: the update is K = 4 times
too large ... multiplied by K"; the bug (a batchmean per micro-batch, / K, times T ** 2) was
called "not divided by K either". The ledger now takes a factor equal to K for K only where
the loss's file multiplies a loss by a name holding K, and a mean whose constants include
the division by K is not "undivided" (on the runs' recordings, 2 gloo ranks, five steps)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from accumguard.observe import _ledger_source
from accumguard.observe._ledger_source import k_multiplications
from tests.helpers import RECORDED, judge_recorded


def _judged_beside_its_script(name: str, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The recording's findings with its script readable where the run named it (the loss
    call sites are relative to the directory the run started in)."""
    monkeypatch.chdir(RECORDED / name)
    _ledger_source._parsed.cache_clear()
    k_multiplications.cache_clear()
    try:
        return judge_recorded(name)
    finally:
        _ledger_source._parsed.cache_clear()
        k_multiplications.cache_clear()


def test_the_twin_with_t_squared_over_the_window_count_is_silent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    findings = _judged_beside_its_script("r96_distill_sum_t2_over_window_count", monkeypatch)
    assert not [f for f in findings if f.severity == "error"], findings  # type: ignore[attr-defined]


def test_the_bug_is_f5_without_the_undivided_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    errors = [f for f in _judged_beside_its_script("r96_distill_batchmean_t2_over_k", monkeypatch)
              if f.severity == "error"]  # type: ignore[attr-defined]
    assert {f.cls for f in errors} == {"F5"}, errors
    assert "not divided by K" not in errors[0].title + errors[0].evidence


def test_k_multiplications_reads_a_loss_times_k_not_an_index(tmp_path: Path) -> None:
    src = tmp_path / "loop.py"
    src.write_text(
        "K = 4\nT = 2.0\n"
        "def f(loss, xs, accum, ga):\n"
        "    a = loss * K\n"          # 4: a loss times K
        "    (loss * accum).backward()\n"  # 5
        "    loss *= ga\n"            # 6
        "    b = xs[3 * K]\n"         # an index: not read
        "    c = loss * T ** 2\n"     # a temperature: not K
        "    return loss\n")
    ast.parse(src.read_text())
    assert k_multiplications(str(src)) == (4, 5, 6)
    assert k_multiplications(str(tmp_path / "missing.py")) is None
