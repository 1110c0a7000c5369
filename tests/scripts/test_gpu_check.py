"""The GPU check script must stay runnable: here it dry-runs on the CPU (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def test_gpu_check_dry_runs_on_cpu() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    out = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--engines", "local,ddp"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CPU dry run" in out.stdout
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.startswith(("local", "ddp"))]
    # fp32 and bf16 for each engine, every one a PASS against the fp64 reference
    assert len(rows) == 4 and all(r[2] == "PASS" for r in rows), out.stdout
