"""Lightning DDP on 2 CPU processes (``strategy="ddp"``, ``accumulate_grad_batches=3``),
recorded as ``watch`` records it (one launch, tests/watch_scripts/lightning_ddp.py).

Lightning's subprocess launcher starts rank 1 from rank 0's process: rank 1's recording
names rank 0's process as its parent, and it was left out as a script's own subprocess, so
every cross-rank rule saw one rank (the loss divided by the world size on top of DDP's
average was a note). A child recording under another rank is that rank. Lightning also runs
each window's last micro-step inside ``optimizer.step(closure)``, after the checksum taken
when the step began: that checksum is not what the optimizer received, and compared across
ranks it was an F11 error on the correct loop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accumguard.watch._findings import analyze, load_recordings

from helpers import free_port, launcher_env

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "lightning_ddp.py"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("pytorch_lightning")
    d = tmp_path_factory.mktemp("lightning_ddp")
    env = {**launcher_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(d)], env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d


@pytest.mark.parametrize(("case", "errors"), [("ok", []), ("world", ["F10"])])
def test_lightning_ddp_both_ranks_judged(out: Path, case: str, errors: list[str]) -> None:
    rec = load_recordings(out / case)
    assert rec.ranks == [0, 1] and rec.children == 0, (rec.ranks, rec.children)
    findings, k, _ = analyze(rec)
    assert k == 3
    assert [f.cls for f in findings if f.severity == "error"] == errors, findings
    if case == "ok":
        assert findings == [], findings
    else:
        (f,) = findings
        assert "divides the loss by the world size" in f.evidence, f.evidence


def test_lightning_manual_sync_fix_is_lightnings_and_it_works(out: Path) -> None:
    """Manual optimisation that all-reduces on every batch: the EXTRA_SYNC fix is worded for
    Lightning (a block_backward_sync inside training_step defers nothing: DDP's forward
    runs around it), and the script that follows it (``manual_flag``) has no finding."""
    findings, k, _ = analyze(load_recordings(out / "manual_sync"))
    assert k == 3
    assert [(f.cls, f.severity, f.rank) for f in findings] == [
        ("EXTRA_SYNC", "warning", 0), ("EXTRA_SYNC", "warning", 1)], findings
    for f in findings:
        assert f.fix.startswith("Lightning:") and "on_train_batch_start" in f.fix, f.fix
        assert "no_sync" not in f.fix
    findings, k, _ = analyze(load_recordings(out / "manual_flag"))
    assert findings == [] and k == 3, findings
