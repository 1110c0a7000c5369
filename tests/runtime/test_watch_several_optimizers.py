"""``accumguard watch`` on GAN-style loops (issue 23, "Errors on correct loops" (a)): the
discriminator's optimizer steps every batch with its own ``zero_grad``, the generator's
accumulates K = 4 batches. Each optimizer is judged on its own window: the correct loop has
no error (it had F3, F7 and F13), the generator's own ``zero_grad`` inside its window is
still F3. Plain PyTorch and Lightning's manual optimisation, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import launcher_env

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "gan_loops.py"


def _watch(tmp_path: Path, *args: str, k: int | None = None) -> tuple[int, list[dict], dict]:
    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "accumguard.cli", "watch", "--json", str(report)]
    if k is not None:
        argv += ["--accumulation-steps", str(k)]
    proc = subprocess.run([*argv, "--", sys.executable, str(SCRIPT), *args],
                          env=launcher_env(), capture_output=True, text=True, timeout=300)
    data = json.loads(report.read_text()) if report.exists() else {}
    assert data, f"no report; stderr:\n{proc.stderr[-3000:]}"
    return proc.returncode, data.get("findings", []), data


@pytest.mark.parametrize(("flavour", "k"), [("plain", 4), ("lightning", None)])
def test_gan_correct_loop_has_no_error(tmp_path: Path, flavour: str, k: int | None) -> None:
    code, findings, _ = _watch(tmp_path, flavour, k=k)
    assert [f for f in findings if f["severity"] == "error"] == [], findings
    assert code == 0
    if k == 4:  # the discriminator steps at its own rate: a note naming it
        (note,) = findings
        assert note["cls"] == "F1" and note["severity"] == "note"
        assert "optimizer #2 (Adam)" in note["evidence"], note


@pytest.mark.parametrize(("flavour", "k"), [("plain", None), ("lightning", 4)])
def test_gan_generator_zero_grad_in_its_window_is_f3(tmp_path: Path, flavour: str,
                                                     k: int | None) -> None:
    code, findings, _ = _watch(tmp_path, flavour, "gen_zero_grad", k=k)
    errors = [f for f in findings if f["severity"] == "error"]
    assert [f["cls"] for f in errors] == ["F3"], findings
    assert errors[0]["evidence"].startswith("optimizer #1 (Adam), judged on its own window")
    assert "zero_grad() ran 3 time(s)" in errors[0]["evidence"]
    assert code == 1
