"""A loss scale computed once as the reciprocal of K x W (blind round 104 b_b03): DDP, the
loss times ``self.loss_scale = 1.0 / (accum_steps * world)``, so DDP's average divides by
W twice. The loss weights total 1/W; the source's division by the world size was not seen
through the name holding the reciprocal, so the total was "not judged" (a constant weight
of 1/2 gives the same). Now a name assigned ``1 / (... world ...)`` multiplying a loss is a
division by the world size: F10. The twin (``1.0 / accum_steps``) stays silent. Recorded on
2 gloo ranks, judged beside their scripts."""

from __future__ import annotations

import pytest

from accumguard.observe import _ledger_source
from accumguard.observe._ledger_source import k_multiplications
from tests.helpers import RECORDED, judge_recorded


def _errors(name: str, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    monkeypatch.chdir(RECORDED / name)
    _ledger_source._parsed.cache_clear()
    _ledger_source._scanned.cache_clear()
    k_multiplications.cache_clear()
    try:
        return [f for f in judge_recorded(name) if f.severity == "error"]
    finally:
        _ledger_source._parsed.cache_clear()
        _ledger_source._scanned.cache_clear()
        k_multiplications.cache_clear()


def test_a_loss_times_the_reciprocal_of_k_w_under_ddp_is_f10(
        monkeypatch: pytest.MonkeyPatch) -> None:
    errors = _errors("r104_ddp_loss_scale_over_k_w", monkeypatch)
    assert [f.cls for f in errors] == ["F10"], errors  # type: ignore[attr-defined]


def test_a_loss_times_the_reciprocal_of_k_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _errors("r104_ddp_loss_scale_over_k", monkeypatch) == []


def test_a_name_holding_the_reciprocal_of_the_world_size_divides_by_it(
        tmp_path: pytest.TempPathFactory) -> None:
    from pathlib import Path

    script = Path(str(tmp_path)) / "s.py"
    script.write_text("import torch.distributed as dist\n"
                      "scale = 1.0 / (4 * dist.get_world_size())\n"
                      "loss = ce * scale\n"
                      "other = 1.0 / 4\n"
                      "loss2 = ce * other\n")
    _ledger_source._scanned.cache_clear()
    _ledger_source._parsed.cache_clear()
    assert (3, "*1/") in _ledger_source.world_divisions(str(script))
    assert not any(ln == 5 for ln, _ in _ledger_source.world_divisions(str(script)))


def test_a_loss_over_a_count_the_file_divides_by_the_world_size_is_f10(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Blind round 133 a_b02, recorded on 2 gloo ranks: a DDP trainer derives ``accum_steps =
    micro_batches_per_step // world`` and divides each micro-batch's mean by
    ``micro_batches_per_step`` (K x W = 8), so DDP's average divides by W twice. The file's
    own arithmetic shows the divisor holds W as a factor; the run shows the division was by
    exactly K x W: F10, the evidence naming the count. The twin (``/ accum_steps``) is silent."""
    errors = _errors("r133_ddp_loss_over_all_ranks_micro_batches", monkeypatch)
    assert [f.cls for f in errors] == ["F10"], errors  # type: ignore[attr-defined]
    evidence = errors[0].evidence  # type: ignore[attr-defined]
    assert "8 (K x W = 4 x 2)" in evidence and "a count with the world size as a factor" in evidence
    assert _errors("r133_ddp_loss_over_rank_micro_batches", monkeypatch) == []
