"""DeepSpeed as the frameworks drive it, on the real libraries (2 CPU gloo ranks), without false
alarms and without crashes:

* DeepSpeed's documented pattern (config GA = K, ``set_gradient_accumulation_boundary(is_last)``
  before each backward, one ``engine.step()`` per window: what Accelerate's DeepSpeed wrapper
  does) is the engine's own accumulation, not double gating (F14); the loop that runs K
  backwards around one ``engine.step()`` with no boundary calls still is F14.
* ``accelerator.backward`` calls ``engine.step()`` inside it at the boundary: the boundary
  backward is counted in its own window (K backwards per step, not K-1; no F13).
* ``accumguard.integrations.accelerate.watch`` and ``AccumguardCallback`` attach to
  Accelerate's ``DeepSpeedOptimizerWrapper`` (never ran ``torch.optim.Optimizer.__init__``):
  silent on the correct runs, F1 / F5 on the buggy ones.
* A step with no backward pass in its window is judged (EXTRA_STEP when it moved the weights).

One launch per framework records several scenarios (``accumguard.runtime.watch.recording``,
analysed as ``accumguard watch`` does); one real ``accumguard watch`` command checks the exit
code of the correct Trainer run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from accumguard.runtime.watch_findings import analyze, load_recordings

from helpers import free_port, launcher_env

SCRIPTS = Path(__file__).resolve().parents[1] / "watch_scripts"
K = 4


def _torchrun(script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(SCRIPTS / script), *args]


def _run(command: list[str], timeout: float = 400) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, env=launcher_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _analysed(out: Path) -> tuple[set[str], list[Any], dict[int, list[dict]]]:
    rec = load_recordings(out)
    assert rec.steps and rec.ranks == [0, 1], f"{out}: nothing recorded"
    findings, k, _ = analyze(rec)
    assert k == K
    return {f.cls for f in findings if f.severity == "error"}, findings, rec.steps


def _windows(steps: dict[int, list[dict]]) -> set[tuple[int, ...]]:
    return {tuple(int(s["backwards"]) for s in ranks) for ranks in steps.values()}


@pytest.fixture(scope="module")
def accel_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for lib in ("deepspeed", "accelerate"):
        pytest.importorskip(lib)
    out = tmp_path_factory.mktemp("ds_frameworks")
    _run(_torchrun("ds_frameworks.py", "--sweep", str(out)))
    return out


@pytest.mark.deepspeed
def test_engine_boundary_pattern_is_not_double_gating(accel_sweep: Path) -> None:
    errors, findings, steps = _analysed(accel_sweep / "ds_boundary")
    assert errors == set(), findings
    assert _windows(steps) == {(K,) * 4}
    # the K-loop around one engine.step() with no boundary calls: the real double gating
    errors, findings, steps = _analysed(accel_sweep / "ds_double")
    assert errors == {"F14"}, findings
    assert _windows(steps) == {(K * K,)}
    f14 = next(f for f in findings if f.cls == "F14")
    assert "not the engine's accumulation boundary" in f14.evidence


@pytest.mark.deepspeed
def test_accelerate_deepspeed_counts_the_boundary_backward(accel_sweep: Path) -> None:
    errors, findings, steps = _analysed(accel_sweep / "accel_ok")
    assert errors == set() and not findings, findings
    assert _windows(steps) == {(K,) * 4}  # the boundary backward is in its own window
    assert json.loads((accel_sweep / "accel_ok" / "checks.json").read_text()) == []
    # no accumulate(): every backward is a boundary, the engine steps on every micro-batch
    errors, findings, steps = _analysed(accel_sweep / "accel_f1")
    assert errors == {"F1"}, findings
    assert _windows(steps) == {(1,) * (4 * K)}
    checks = json.loads((accel_sweep / "accel_f1" / "checks.json").read_text())
    assert {f["class_id"] for f in checks} == {"F1"}, checks


@pytest.fixture(scope="module")
def hf_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for lib in ("deepspeed", "accelerate", "transformers"):
        pytest.importorskip(lib)
    out = tmp_path_factory.mktemp("hf_ds")
    _run(_torchrun("hf_ds_train.py", "--modes", "ok,mean", "--sweep", str(out)))
    return out


@pytest.mark.deepspeed
def test_trainer_deepspeed_callback_and_recording(hf_sweep: Path) -> None:
    errors, findings, steps = _analysed(hf_sweep / "ok")
    assert errors == set(), findings
    assert _windows(steps) == {(K,) * 3}
    assert json.loads((hf_sweep / "ok-callback.json").read_text()) == []
    # compute_loss ignoring num_items_in_batch (uneven token counts): F5, seen by both
    errors, findings, _ = _analysed(hf_sweep / "mean")
    assert errors == {"F5"}, findings
    callback = json.loads((hf_sweep / "mean-callback.json").read_text())
    assert {f["class_id"] for f in callback} == {"F5"}, callback


@pytest.mark.deepspeed
def test_trainer_deepspeed_under_the_watch_cli(tmp_path: Path) -> None:
    """The command the issue ran: ``accumguard watch -- torchrun train.py`` on a correct
    Trainer + DeepSpeed run exits 0 with no error (it said F14 and F13, exit 1)."""
    for lib in ("deepspeed", "accelerate", "transformers"):
        pytest.importorskip(lib)
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "accumguard.cli", "watch", "--json",
                           str(report), "--",
                           *_torchrun("hf_ds_train.py", "--modes", "ok", "--out", str(tmp_path))],
                          env=launcher_env(), capture_output=True, text=True, timeout=400)
    data = json.loads(report.read_text()) if report.exists() else {}
    assert data, proc.stderr[-4000:]
    errors = [f for f in data["findings"] if f["severity"] == "error"]
    assert proc.returncode == 0 and not errors, (errors, proc.stderr[-3000:])
    assert data["ranks"] == [0, 1] and data["accumulation_steps"] == K
    assert json.loads((tmp_path / "ok-callback.json").read_text()) == []


# ----------------------------------------------------------------- a step with no backward
def _double_step_loop(momentum: float, bug: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=momentum)
    other = torch.optim.SGD(model[1].parameters(), lr=0.1, momentum=momentum)
    for _ in range(3):
        for _ in range(K):
            model(torch.randn(3, 4)).pow(2).mean().div(K).backward()
        opt.step()
        if bug == "twice":  # a second step on the same window's gradient
            opt.step()
        elif bug == "zeroed":  # a second step on zeroed gradients
            opt.zero_grad(set_to_none=False)
            opt.step()
        elif bug == "two_optimizers":  # correct: another optimizer steps right after
            other.step()
            other.zero_grad()
        elif bug == "autograd_grad":  # correct: a window of gradients made by autograd.grad
            opt.zero_grad()
            grads = torch.autograd.grad(model(torch.randn(3, 4)).pow(2).mean(),
                                        list(model[0].parameters()))
            for p, g in zip(model[0].parameters(), grads, strict=True):
                p.grad = g
            opt.step()
        opt.zero_grad()


@pytest.mark.parametrize(("momentum", "bug", "want"), [
    (0.9, "", set()), (0.0, "twice", {"EXTRA_STEP"}),
    (0.9, "zeroed", {"EXTRA_STEP"}),  # momentum moves the weights on a zero gradient
    (0.0, "zeroed", set()),  # plain SGD on a zero gradient: a no-op, no finding
    (0.9, "two_optimizers", set()),  # a second optimizer's step is not a second step
    (0.9, "autograd_grad", set()),  # a new gradient no backward made: not a second step
])
def test_a_step_without_backward_is_judged(tmp_path: Path, momentum: float, bug: str,
                                           want: set[str]) -> None:
    from accumguard.runtime.watch import recording

    with recording(tmp_path):
        _double_step_loop(momentum, bug)
    rec = load_recordings(tmp_path)
    # (each optimizer has its own window: the second one's holds the K backwards too)
    want_windows = {"": [K] * 3, "two_optimizers": [K, K] * 3}.get(bug, [K, 0] * 3)
    assert [s["backwards"] for s in rec.steps[0]] == want_windows
    findings, _, _ = analyze(rec)
    assert {f.cls for f in findings if f.severity == "error"} == want, findings
    if want:
        f = next(f for f in findings if f.cls == "EXTRA_STEP")
        assert f.step == 2 and "stepped again with no backward pass" in f.evidence
        assert "(optimizer step 1)" in f.evidence
