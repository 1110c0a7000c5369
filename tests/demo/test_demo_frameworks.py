"""``accumguard demo --frameworks``: one real run (one spawn of 2 gloo ranks for the
transformers Trainer, Lightning and Accelerate), judged from its JSON; the verdict rules
on fabricated runs (a false alarm, a broken default that is not off); frameworks that
are not installed; the CLI flag's argument checks."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from accumguard.cli import main
from accumguard.demo import frameworks as fwd
from accumguard.demo.plots import FRAMEWORKS_PNG
from accumguard.verify.reference import reference_run

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("pytorch_lightning")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any], str, Path]:
    out_dir = tmp_path_factory.mktemp("fw-demo")
    stream = io.StringIO()
    result = fwd.run_frameworks_demo(out_dir=out_dir, timeout=400, stream=stream)
    report = json.loads((out_dir / fwd.REPORT_JSON).read_text())
    return result, report, stream.getvalue(), out_dir


def test_every_verdict_as_expected(demo: tuple[Any, dict[str, Any], str, Path]) -> None:
    result, report, text, out_dir = demo
    assert result.exit_code == 0 and report["passed"] is True, text
    rows = {(r["framework"], r["run"]): r for r in report["rows"]}
    assert set(rows) == {(f, run) for f in fwd.FRAMEWORKS for run in ("broken", "exact")}
    for (fw, run), r in rows.items():
        assert r["as_expected"] is True, (fw, run, r)
        assert r["window_sizes"] == [4, 4, 2], r  # uneven counts and a partial final window
        assert len(r["update_errors"]) == 3
        if run == "exact":
            assert r["verdict"] == "PASS" and r["max_update_error"] <= fwd.EXACT_TOL, r
            assert r["findings"] == []
        else:
            assert r["verdict"] == "FAIL" and min(r["update_errors"]) >= fwd.BROKEN_MIN, r
            assert "F5" in r["finding_classes"], r
    # Accelerate's prepared scheduler advances its schedule once per process per step: by
    # Accelerate's design (said as info), not F4, as accumguard watch counts it
    assert rows[("accelerate", "broken")]["finding_classes"] == ["F5"]
    assert (out_dir / FRAMEWORKS_PNG).stat().st_size > 10_000
    assert "verdict: every run as expected" in text
    assert "F5: micro-steps with" in text  # the callback's own evidence is shown


def _fabricated(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two ranks whose 'training' is the reference itself (update error ~0)."""
    s = fwd.token_samples(8, seed=1)
    batches = [{k: torch.stack([x[k] for x in s[i:i + 2]]) for k in s[0]} for i in (0, 2, 4, 6)]
    rank_windows = [[[batches[0]], [batches[1]]], [[batches[2]], [batches[3]]]]
    windows = [[b for r in rank_windows for b in r[j]] for j in range(2)]
    ref = reference_run(fwd.tiny_llama(0), fwd._opt, windows, fwd.sum_loss,
                            make_scheduler=fwd._sched)
    return [{"lightning": {run: {"windows": rw, "snaps": ref.params, "findings": findings}
                           for run in ("broken", "exact")}} for rw in rank_windows]


def test_verdict_rules_can_fail() -> None:
    f5 = [{"step": 0, "class_id": "F5", "evidence": "x"}]
    ranks = _fabricated(f5)
    exact = fwd._judge("lightning", "exact", ranks)
    assert exact.verdict == "PASS" and exact.as_expected is False  # a false alarm
    assert "false alarm" in exact.note
    broken = fwd._judge("lightning", "broken", ranks)
    assert broken.verdict == "PASS" and broken.as_expected is False  # not off at all
    clean = fwd._judge("lightning", "exact", _fabricated([]))
    assert clean.as_expected is True and clean.max_update_error is not None
    assert clean.max_update_error < 1e-6


def test_not_installed_is_skipped_with_the_pip_command(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fwd, "_missing", lambda name: ["pytorch_lightning or lightning"])
    stream = io.StringIO()
    result = fwd.run_frameworks_demo(("lightning",), out_dir=tmp_path, stream=stream)
    assert result.exit_code == 0
    assert [r.verdict for r in result.rows] == ["SKIP", "SKIP"]
    assert "pip install 'accumguard[lightning]'" in result.rows[0].note
    assert "pip install 'accumguard[lightning]'" in stream.getvalue()


def test_cli_flag_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert fwd.parse_frameworks(None) == tuple(fwd.FRAMEWORKS)
    assert fwd.parse_frameworks("accelerate, lightning") == ("accelerate", "lightning")
    assert main(["demo", "--frameworks", "keras"]) == 2
    assert "unknown framework 'keras'" in capsys.readouterr().err
    assert main(["demo", "--frameworks", "--engines", "ddp"]) == 2
    assert "cannot be combined with --frameworks" in capsys.readouterr().err
