"""Lightning Fabric DDP on 2 CPU processes (``strategy="ddp"``, K = 3 under
``no_backward_sync``), recorded as ``watch`` records it (one launch,
tests/watch_scripts/fabric_ddp.py).

The script calls Fabric's ``_FabricModule``, not the DDP model inside it: read as the root,
the run was a local one (no engine, no sync flags, no reduction), so a loss divided by the
world size on top of DDP's average, or heads DDP never held, were silent (blind round 109
a_b03)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accumguard.watch._findings import analyze, load_recordings

from helpers import free_port, launcher_env

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "fabric_ddp.py"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lightning_fabric")
    d = tmp_path_factory.mktemp("fabric_ddp")
    env = {**launcher_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(d)], env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d


def test_fabric_ddp_is_ddp_and_its_sync_flags_are_read(out: Path) -> None:
    rec = load_recordings(out / "ok")
    assert rec.ranks == [0, 1]
    for r in rec.ranks:
        step = rec.steps[r][0]
        assert step["engine"] == "ddp", step["engine"]
        assert step["sync_micros"] == [False, False, True], step["sync_micros"]
    findings, k, _ = analyze(rec)
    assert k == 3 and findings == [], findings
    assert not rec.judge_failures


def test_fabric_loss_divided_by_world_size_is_f10(out: Path) -> None:
    rec = load_recordings(out / "world")
    findings, _, _ = analyze(rec)
    assert [(f.cls, f.severity.value) for f in findings] == [("F10", "error")], findings
    (f,) = findings
    assert "sum of 2 terms" in f.evidence and "divides the loss by the world size" in f.evidence
    assert "2x too small" in f.evidence and "fabric_ddp.py:50" in f.evidence, f.evidence
    assert not rec.judge_failures


def test_fabric_heads_in_a_plain_dict_are_f10(out: Path) -> None:
    rec = load_recordings(out / "dict_heads")
    findings, _, _ = analyze(rec)
    assert [(f.cls, f.severity.value) for f in findings] == [("F10", "error")], findings
    (f,) = findings
    assert "DDP does not reduce" in f.evidence and "sums of squares" in f.evidence
    assert "nn.ModuleDict" in f.fix and "fabric.setup" in f.fix, f.fix
