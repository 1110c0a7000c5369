"""The autograd features people use, observed without breaking or changing the run.

Every feature of ``tests/watch_scripts/features.py`` (activation checkpointing reentrant
and not, torch.compile with ``aot_eager`` and ``inductor``, an embedding resized with the
optimizer rebuilt, freeze/unfreeze between windows, ``add_param_group`` with a head first
called mid-window, sparse gradients + SparseAdam, ``torch.autograd.grad`` assigned by hand,
persistent DataLoader workers, a torch subprocess, tied weights, BatchNorm buffers, a
module first called mid-window, the script's own chaining SIGTERM handler, its own import
hook) is a correct K = 2 loop, run under plain, DDP and FSDP2 (2 gloo ranks) where it
applies. Four launches:

* in-process (the Observer of ``recording()``): each feature runs unobserved, then
  observed, in one process (one launch for plain, one torchrun launch for DDP + FSDP2);
  the two final parameter sets must be bit-identical, and each feature's own recording
  must give no error finding and no internal-failure record;
* under the real ``accumguard watch`` CLI (one launch for plain, one torchrun launch for
  DDP + FSDP2, every feature one after the other): the run must end as it does alone
  (exit 0), accumguard must report no failure of its own and no error, and every
  feature's final parameters must equal the unobserved in-process run's, bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accumguard.runtime.watch_findings import analyze, load_recordings

from helpers import free_port, launcher_env

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "features.py"
sys.path.insert(0, str(SCRIPT.parent))
from features import APPLIES, FEATURES  # noqa: E402

DIST = ("ddp", "fsdp2")
CASES = [(e, f) for e in ("plain", *DIST) for f in APPLIES[e]]


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT), *args]


def _run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, env=launcher_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode and "--master-port" in argv and (
            "EADDRINUSE" in proc.stderr or "Address already in use" in proc.stderr):
        i = argv.index("--master-port") + 1  # the port was taken meanwhile: once more
        argv = [*argv[:i], str(free_port()), *argv[i + 1:]]
        proc = subprocess.run(argv, env=launcher_env(), capture_output=True, text=True,
                              timeout=timeout)
    return proc


@pytest.fixture(scope="module")
def inproc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inproc")
    names = ",".join(FEATURES)
    for argv in ([sys.executable, str(SCRIPT), str(out), "plain", names, "--inproc"],
                 _torchrun(str(out), ",".join(DIST), names, "--inproc")):
        proc = _run(argv)
        assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _watch(out: Path, command: list[str]) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = out / "report.json"
    proc = _run([sys.executable, "-m", "accumguard.cli", "watch", "--json", str(report),
                 "--accumulation-steps", "2", "--", *command])
    data = json.loads(report.read_text()) if report.exists() else {}
    assert data, f"no report; stderr:\n{proc.stderr[-3000:]}"
    return proc, data


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int, dict, str]]:
    """engine -> (parameter directory, watch's exit code, its JSON report, stderr tail)."""
    out = tmp_path_factory.mktemp("watched")
    names = ",".join(FEATURES)
    runs = {}
    for key, command in (
            ("plain", [sys.executable, str(SCRIPT), str(out / "plain"), "plain", names]),
            ("dist", _torchrun(str(out / "dist"), ",".join(DIST), names))):
        (out / key).mkdir()
        proc, report = _watch(out / key, command)
        runs[key] = (out / key, proc.returncode, report, proc.stderr[-4000:])
    return runs


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def _ranks(engine: str) -> range:
    return range(1) if engine == "plain" else range(2)


@pytest.mark.parametrize(("engine", "feature"), CASES)
def test_observer_in_process_changes_nothing(inproc: Path, engine: str, feature: str) -> None:
    tag = f"{engine}-{feature}"
    for r in _ranks(engine):
        saved = _load(inproc / f"params-{tag}-rank{r}.pt")
        differ = [k for k in saved["ref"] if not torch.equal(saved["ref"][k], saved["obs"][k])]
        assert not differ, f"{tag} rank {r}: observed run differs in {differ}"
    kinds = {json.loads(line).get("kind") for p in (inproc / tag).glob("rank-*.jsonl")
             for line in p.read_text().splitlines() if line.strip()}
    assert "internal_error" not in kinds, f"{tag}: accumguard failed inside the run"
    rec = load_recordings(inproc / tag)
    assert all(len(rec.steps.get(r, [])) == 3 for r in _ranks(engine)), rec.steps.keys()
    # conservation was checked (the features must not switch observation off)
    assert any(s["conservation"] is not None for s in rec.steps[0]), tag
    findings, _, _ = analyze(rec, k_flag=2)
    errors = [(f.cls, f.step, f.evidence) for f in findings if f.severity == "error"]
    assert not errors, f"{tag}: {errors}"


@pytest.mark.parametrize("key", ["plain", "dist"])
def test_watch_cli_reports_no_failure_and_no_error(watched: dict, key: str) -> None:
    _, code, report, stderr = watched[key]
    assert not report.get("accumguard_failed"), report.get("accumguard_failed")
    assert report.get("exit_code", 0) == 0 and not report.get("signal"), stderr
    errors = [(f["cls"], f["step"], f["evidence"]) for f in report["findings"]
              if f["severity"] == "error"]
    assert not errors, errors
    assert code == 0, stderr


@pytest.mark.parametrize(("engine", "feature"), CASES)
def test_watch_cli_changes_no_parameter(inproc: Path, watched: dict, engine: str,
                                        feature: str) -> None:
    out = watched["plain" if engine == "plain" else "dist"][0]
    tag = f"{engine}-{feature}"
    for r in _ranks(engine):
        path = out / f"params-{tag}-rank{r}.pt"
        assert path.exists(), f"{tag}: the watched run did not finish this feature"
        got, ref = _load(path), _load(inproc / f"params-{tag}-rank{r}.pt")["ref"]
        differ = [k for k in ref if not torch.equal(ref[k], got[k])]
        assert not differ, f"{tag} rank {r}: watched run differs in {differ}"
