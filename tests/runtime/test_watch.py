"""``accumguard watch`` on real commands: torchrun-style DDP, plain python, DeepSpeed.

Each case runs a script of ``tests/watch_scripts`` unmodified under ``watch`` and checks
the exit code and the failure classes of the error-level findings: a correct script
exits 0 with no error (false alarms are worse than misses), a broken one exits 1 with
the right class.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "watch_scripts"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _watch(tmp_path: Path, command: list[str], *, k: int | None = None,
           timeout: float = 240) -> tuple[int, list[dict], dict]:
    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "accumguard.cli", "watch", "--json", str(report)]
    if k is not None:
        argv += ["--accumulation-steps", str(k)]
    env = {k_: v for k_, v in os.environ.items()
           if not k_.startswith(("TORCHELASTIC", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    proc = subprocess.run([*argv, "--", *command], env=env, capture_output=True, text=True,
                          timeout=timeout)
    data = json.loads(report.read_text()) if report.exists() else {}
    assert data, f"no report; stderr:\n{proc.stderr[-3000:]}"
    return proc.returncode, data.get("findings", []), data


def _errors(findings: list[dict]) -> set[str]:
    return {f["cls"] for f in findings if f["severity"] == "error"}


def _torchrun(script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(_port()),
            str(SCRIPTS / script), *args]


@pytest.mark.parametrize(("bug", "expected"), [
    ("none", set()), ("wasteful", set()), ("F1", {"F1"}), ("F3", {"F3"}), ("F4", {"F4"}),
    ("F7", {"F7"}), ("F8", {"F8"}), ("F11", {"F11"}), ("F13", {"F13"}),
])
def test_ddp_torchrun(tmp_path: Path, bug: str, expected: set[str]) -> None:
    code, findings, report = _watch(tmp_path, _torchrun("ddp_plain.py", "--bug", bug), k=4)
    assert report["ranks"] == [0, 1]
    if not expected:
        assert code == 0 and not _errors(findings), findings
    else:
        assert code == 1
        assert expected <= _errors(findings), findings
    if bug == "wasteful":  # honest severity: a note with the extra collectives
        notes = [f for f in findings if f["severity"] == "note"]
        assert notes and "wasteful" in notes[0]["evidence"]


@pytest.mark.parametrize(("case", "expected"), [
    ("namespace", set()), ("k1", set()), ("heads", set()), ("gan", set()),
    ("fp32buf", set()), ("epochs", set()), ("leak", {"F13"}),
])
def test_single_process_patterns(tmp_path: Path, case: str, expected: set[str]) -> None:
    code, findings, report = _watch(
        tmp_path, [sys.executable, str(SCRIPTS / "plain_patterns.py"), "--case", case])
    assert report["steps"], "no step observed"
    assert _errors(findings) == expected, findings
    assert code == (1 if expected else 0)


@pytest.mark.parametrize(("launcher", "args", "expected"), [
    ("deepspeed", ["--mode", "native", "--stage", "2"], set()),
    ("torchrun", ["--mode", "manual", "--stage", "2"], {"F2"}),
    ("torchrun", ["--mode", "double", "--stage", "1", "--no-clip"], {"F14", "F9"}),
])
def test_deepspeed(tmp_path: Path, launcher: str, args: list[str], expected: set[str]) -> None:
    pytest.importorskip("deepspeed")
    if launcher == "deepspeed":
        cmd = ["deepspeed", "--num_gpus", "2", "--master_port", str(_port()),
               str(SCRIPTS / "ds_train.py"), *args]
    else:
        cmd = _torchrun("ds_train.py", *args)
    code, findings, report = _watch(tmp_path, cmd, timeout=400)
    assert report["engine"], "the DeepSpeed config was not recorded"
    assert _errors(findings) == expected, findings
    assert code == (1 if expected else 0)


def test_bad_commands(tmp_path: Path) -> None:
    code, _, _ = (subprocess.run([sys.executable, "-m", "accumguard.cli", "watch", "--",
                                  "no-such-command-xyz"], capture_output=True, text=True,
                                 timeout=60).returncode, None, None)
    assert code == 127
    proc = subprocess.run([sys.executable, "-m", "accumguard.cli", "watch", "--json",
                           str(tmp_path / "r.json"), "--", sys.executable, "-c",
                           "import sys; print('hi'); sys.exit(3)"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "hi\n"  # the command's output passes through untouched
    assert "no optimizer step was observed" in proc.stderr
