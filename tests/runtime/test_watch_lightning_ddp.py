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
