"""Fault injection on real engines and frameworks, under the real ``accumguard watch``:
an internal error of accumguard in one of its doors (a patch or a hook, before or after
the wrapped call) leaves the run bit-identical to the unobserved run, and the report says
first that accumguard failed (exit code 3), never "no accumulation finding".

One correct loop per stack (tests/watch_scripts/failsafe_stacks.py, K = 4): plain, DDP,
FSDP2, DeepSpeed ZeRO-2 and ZeRO-0 (its default clip) on 2 gloo ranks (torchrun), Accelerate, the HF Trainer and
Lightning in one process. The unobserved runs take two launches for all stacks (module
fixture); each stack's faulted run is its own real ``watch`` launch. Every door kind is swept in-process by
tests/observe/test_failsafe.py; here each stack fails in a door of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import free_port, launcher_env

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "failsafe_stacks.py"
TWO_RANKS = {"ddp", "fsdp2", "deepspeed", "deepspeed0"}

#: stack -> the door that fails (label[:pre|post]@call)
CASES = {
    "plain": "hook:_on_grad:pre@5",
    "ddp": "hook:_global_pre:pre@3",
    "fsdp2": "Tensor.backward:post@3",
    "deepspeed": "DeepSpeedEngine.backward:post@2",
    # ZeRO-0 fp32 with the engine's default clip: the norm read before the engine clips
    "deepspeed0": "DeepSpeedEngine.clip_fp32_gradients:pre@1",
    "accelerate": "Accelerator.backward:pre@3",
    "hf": "hook:_opt_post:pre@2",
    "lightning": "Optimizer.zero_grad:post@1",
}


def _command(stack: str, out: Path) -> list[str]:
    if stack in TWO_RANKS:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                str(SCRIPT), stack, str(out)]
    return [sys.executable, str(SCRIPT), stack, str(out)]


# torch 2.13 + gloo: a rank sometimes aborts in C++ at interpreter exit, after its work
# (seen without accumguard too): such a launch is run again, once
_TEARDOWN_ABORT = "terminate called without an active exception"


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    if _TEARDOWN_ABORT in proc.stderr:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600,
                              cwd=cwd)
    return proc


RUN_SCRIPTS = SCRIPT.parent / "run_scripts.py"


@pytest.fixture(scope="module")
def unobserved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every stack's digest without accumguard, in two launches instead of seven: the
    one-process stacks one after the other in one process, the 2-rank stacks in one torchrun
    launch (``run_scripts.py``; each stack seeds its own model and data)."""
    out = tmp_path_factory.mktemp("unobserved")
    env = launcher_env()
    for two_ranks in (False, True):
        stacks = [s for s in CASES if (s in TWO_RANKS) == two_ranks]
        scripts: list[str] = []
        for stack in stacks:
            scripts += [*(["--"] if scripts else []), str(SCRIPT), stack, str(out / stack)]
        launcher = _command(stacks[0], out)[:-3]  # python, or torchrun with its options
        proc = _run([*launcher, str(RUN_SCRIPTS), *scripts], env, out)
        assert proc.returncode == 0, proc.stderr[-3000:]
    digests = {stack: (out / stack).read_text() for stack in CASES}
    assert all(len(d) == 64 for d in digests.values()), digests  # every stack trained
    return digests


@pytest.mark.parametrize("stack", list(CASES))
def test_an_internal_failure_leaves_the_run_unchanged(tmp_path: Path, stack: str,
                                                      unobserved: dict[str, str]) -> None:
    faulted, report = tmp_path / "faulted.txt", tmp_path / "r.json"
    env = launcher_env()
    env["ACCUMGUARD_TEST_FAULT"] = CASES[stack]
    watched = _run([sys.executable, "-m", "accumguard.cli", "watch", "--json", str(report),
                    "--", *_command(stack, faulted)], env, tmp_path)
    assert faulted.read_text() == unobserved[stack], watched.stderr[-3000:]
    data = json.loads(report.read_text())
    assert watched.returncode == 3, watched.stderr[-3000:]
    assert data["accumguard_failed"], data
    assert "FAILED on rank" in data["accumguard_failed"][0]
    assert "InjectedFault" in data["accumguard_failed"][0]
    assert not [f for f in data["findings"] if f["severity"] == "error"], data["findings"]
    assert "no accumulation finding\n" not in watched.stderr
    first = watched.stderr.index("accumguard FAILED")
    assert first < watched.stderr.index("accumguard watch:"), "the failure is said first"
