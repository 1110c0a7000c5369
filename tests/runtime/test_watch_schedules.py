"""F4 schedule horizons under the real ``accumguard watch`` launch: a plain loop whose
cosine horizon counts micro-batches (K x late) and an Accelerate 2-process run whose
horizon was computed after ``prepare`` (W x early), each with its correct twin.

The cases of a test run in one launch (tests/watch_sweep.py: one ``python``, one
``accelerate launch``), each recorded as ``watch`` records it and judged by the function
the CLI calls; tests/runtime/test_watch.py launches the real CLI under each launcher."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_watch import _errors
from watch_sweep import Watched, watch_many

from helpers import free_port

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "sched_horizon.py"


PLAIN = [("plain_ok", set()), ("plain_bug", {"F4"}), ("plain_short", set())]
ACCEL = [("accel_ok", set()), ("accel_bug", {"F4"})]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return watch_many(tmp_path_factory.mktemp("horizon_plain"),
                      {mode: [sys.executable, str(SCRIPT), mode] for mode, _ in PLAIN})


@pytest.fixture(scope="module")
def accel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    pytest.importorskip("accelerate")
    return watch_many(tmp_path_factory.mktemp("horizon_accel"), {mode: [
        "accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip",
        "127.0.0.1", "--main_process_port", str(free_port()), str(SCRIPT), mode]
        for mode, _ in ACCEL})


@pytest.mark.parametrize(("mode", "expected"), PLAIN)
def test_plain_loop_horizon(plain: dict[str, Watched], mode: str, expected: set[str]) -> None:
    code, findings, _, _ = plain[mode]
    assert _errors(findings) == expected, findings
    if expected:
        f4 = next(f for f in findings if f["cls"] == "F4")
        assert "T_max=32" in f4["evidence"] and "4x late" in f4["title"], f4


@pytest.mark.parametrize(("mode", "expected"), ACCEL)
def test_accelerate_prepared_scheduler_horizon(accel: dict[str, Watched], mode: str,
                                               expected: set[str]) -> None:
    code, findings, report, _ = accel[mode]
    assert report["ranks"] == [0, 1]
    assert _errors(findings) == expected, findings
    if expected:
        f4 = next(f for f in findings if f["cls"] == "F4")
        assert "optimizer step 4 of 8" in f4["title"] and "num_processes" in f4["fix"], f4
