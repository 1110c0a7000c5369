"""F4 schedule horizons under the real ``accumguard watch`` launch: a plain loop whose
cosine horizon counts micro-batches (K x late) and an Accelerate 2-process run whose
horizon was computed after ``prepare`` (W x early), each with its correct twin."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_watch import _errors, _watch  # the watch-CLI helper of the launcher tests

from helpers import free_port

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "sched_horizon.py"


@pytest.mark.parametrize(("mode", "expected"), [
    ("plain_ok", set()), ("plain_bug", {"F4"}), ("plain_short", set())])
def test_plain_loop_horizon(tmp_path: Path, mode: str, expected: set[str]) -> None:
    code, findings, _, _ = _watch(tmp_path, [sys.executable, str(SCRIPT), mode], timeout=200)
    assert _errors(findings) == expected, findings
    if expected:
        f4 = next(f for f in findings if f["cls"] == "F4")
        assert "T_max=32" in f4["evidence"] and "4x late" in f4["title"], f4


@pytest.mark.parametrize(("mode", "expected"), [("accel_ok", set()), ("accel_bug", {"F4"})])
def test_accelerate_prepared_scheduler_horizon(tmp_path: Path, mode: str,
                                               expected: set[str]) -> None:
    pytest.importorskip("accelerate")
    cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip",
           "127.0.0.1", "--main_process_port", str(free_port()), str(SCRIPT), mode]
    code, findings, report, _ = _watch(tmp_path, cmd, timeout=300)
    assert report["ranks"] == [0, 1]
    assert _errors(findings) == expected, findings
    if expected:
        f4 = next(f for f in findings if f["cls"] == "F4")
        assert "optimizer step 4 of 8" in f4["title"] and "num_processes" in f4["fix"], f4
