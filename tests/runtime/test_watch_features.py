"""The autograd features people use, observed without breaking or changing the run.

Every feature of ``tests/watch_scripts/features.py`` (activation checkpointing reentrant
and not, torch.compile with ``aot_eager`` and ``inductor``, an embedding resized with the
optimizer rebuilt, freeze/unfreeze between windows, ``add_param_group`` with a head first
called mid-window, sparse gradients + SparseAdam, ``torch.autograd.grad`` assigned by hand,
persistent DataLoader workers, a torch subprocess, tied weights, BatchNorm buffers, a
module first called mid-window, the script's own chaining SIGTERM handler, its own import
hook) is a correct K = 2 loop, run under plain, DDP and FSDP2 (2 gloo ranks) where it
applies. Four launches:

* in-process, one process (the Observer of ``recording()``): each feature runs
  unobserved, then observed; the two final parameter sets must be bit-identical, and each
  feature's own recording must give no error finding, no internal-failure record, and
  (where a backward pass runs) conservation verdicts;
* the unobserved reference of DDP then FSDP2 (one torchrun launch, every feature);
  in these two launches the ``subprocess`` feature's child does not import torch
  (``--child-without-torch``): nothing observes it there, and the parent's parameters
  are what is compared;
* under the real ``accumguard watch`` CLI (one launch for plain, one torchrun launch for
  DDP + FSDP2, every feature one after the other): the run must end as it does alone
  (exit 0), accumguard must report no failure of its own and no error, and every
  feature's final parameters must equal the unobserved run's, bit for bit.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accumguard.watch._findings import analyze, load_recordings

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
    """One process: each feature unobserved, then observed in-process (``recording()``)."""
    out = tmp_path_factory.mktemp("inproc")
    proc = _run([sys.executable, str(SCRIPT), str(out), "plain", ",".join(FEATURES),
                 "--inproc", "--child-without-torch"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def dist_ref(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 gloo ranks, DDP then FSDP2, every feature unobserved: the reference parameters."""
    out = tmp_path_factory.mktemp("dist_ref")
    proc = _run(_torchrun(str(out), ",".join(DIST), ",".join(FEATURES), "--child-without-torch"))
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


@pytest.mark.parametrize("feature", APPLIES["plain"])
def test_observer_in_process_changes_nothing(inproc: Path, feature: str) -> None:
    engine = "plain"
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
    # conservation was checked (the features must not switch observation off), except
    # where no backward pass runs (gradients from torch.autograd.grad: nothing to bracket)
    if feature != "autograd_grad":
        assert any(s["conservation"] is not None for s in rec.steps[0]), tag
    findings, _, _ = analyze(rec, k_flag=2)
    errors = [(f.cls, f.step, f.evidence) for f in findings if f.severity == "error"]
    assert not errors, f"{tag}: {errors}"


@pytest.mark.parametrize("key", ["plain", "dist"])
def test_watch_cli_reports_no_failure_and_no_finding(watched: dict, key: str) -> None:
    _, code, report, stderr = watched[key]
    assert not report.get("accumguard_failed"), report.get("accumguard_failed")
    assert report.get("exit_code", 0) == 0 and not report.get("signal"), stderr
    # these loops are correct and sync only where needed: not even a note is true of them
    # (a model built after the roots were pinned had its sync flag read off the first one:
    # "correct but wasteful" on a loop that defers the sync)
    said = [(f["cls"], f["severity"], f["step"], f["evidence"]) for f in report["findings"]
            if f["severity"] != "info"]
    assert not said, said
    assert code == 0, stderr


@pytest.mark.parametrize(("engine", "feature"), CASES)
def test_watch_cli_changes_no_parameter(inproc: Path, dist_ref: Path, watched: dict,
                                        engine: str, feature: str) -> None:
    out = watched["plain" if engine == "plain" else "dist"][0]
    tag = f"{engine}-{feature}"
    for r in _ranks(engine):
        path = out / f"params-{tag}-rank{r}.pt"
        assert path.exists(), f"{tag}: the watched run did not finish this feature"
        if engine == "plain":
            ref = _load(inproc / f"params-{tag}-rank{r}.pt")["ref"]
        else:
            ref = _load(dist_ref / f"params-{tag}-rank{r}.pt")
        got = _load(path)
        differ = [k for k in ref if not torch.equal(ref[k], got[k])]
        assert not differ, f"{tag} rank {r}: watched run differs in {differ}"


_SIGTERM_SCRIPT = """
import os, signal, torch
print("default:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
m = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(2):
    m(torch.ones(2, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
m(torch.ones(2, 3)).sum().backward()
os.kill(os.getpid(), signal.SIGTERM)
print("not reached", flush=True)
"""


def test_sigterm_without_a_handler_dies_as_before_and_flushes(tmp_path: Path) -> None:
    """The agent's SIGTERM handler is invisible (``signal.getsignal`` says SIG_DFL, as
    without accumguard) and a script without its own handler still dies of SIGTERM, its
    recording ended by an ``end`` record (reason ``signal``, the pending backward counted)."""
    script = tmp_path / "term.py"
    script.write_text(_SIGTERM_SCRIPT)
    keep = tmp_path / "rec"
    report = tmp_path / "report.json"
    proc = _run([sys.executable, "-m", "accumguard.cli", "watch", "--keep", str(keep), "--json",
                 str(report), "--", sys.executable, str(script)])
    assert "default: True" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "not reached" not in proc.stdout
    lines = [json.loads(x) for x in (keep / "rank-0.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in lines].count("step") == 2
    end = lines[-1]
    assert end["kind"] == "end" and end["reason"] == "signal", end
    assert end["pending_backwards"] == 1
    alone = subprocess.run([sys.executable, str(script)], env=launcher_env(),
                           capture_output=True, text=True, timeout=120)
    assert alone.returncode == -signal.SIGTERM
    data = json.loads(report.read_text())
    assert data["signal"] == "SIGTERM", data  # the watched command died of it as well


def test_a_subprocess_recording_is_not_its_parents_rank(tmp_path: Path) -> None:
    """A process started by a recorded process (the script's own subprocess inherits the
    rank's environment) records under the same rank; its steps are left out of the rank's,
    whichever of the two opened ``rank-0.jsonl`` first."""
    def write(name: str, pid: int, ppid: int, steps: int) -> None:
        recs = [{"kind": "start", "rank": 0, "world": 1, "pid": pid, "ppid": ppid}]
        recs += [{"kind": "step", "rank": 0, "step": i, "backwards": 2} for i in range(steps)]
        recs.append({"kind": "end", "reason": "exit", "steps": steps})
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))

    write("rank-0.jsonl", 200, 100, 1)  # the child flushed first
    write("rank-0.pid-100.jsonl", 100, 50, 3)
    rec = load_recordings(tmp_path)
    assert len(rec.steps[0]) == 3 and rec.children == 1
    assert rec.end[0]["steps"] == 3
