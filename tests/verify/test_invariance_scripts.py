"""accumguard invariance on real scripts, through the real observation layer.

Real processes: plain ``python`` and 2 gloo ranks under torchrun
(``python -m torch.distributed.run`` on 127.0.0.1). The script
(tests/invariance_scripts/token_lm.py) trains a tiny token LM on sequences of
uneven valid lengths, so a per-micro-batch token mean / K (F5) changes the
update from the first optimizer step on, and sum / window count does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from accumguard import invariance as inv
from accumguard.invariance import _run as inv_run

from helpers import free_port

SCRIPT = Path(__file__).resolve().parents[1] / "invariance_scripts" / "token_lm.py"
TIMEOUT = 300


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args]


def _invariance(cli: Any, tmp_path: Path, name: str, command: list[str], *extra: str
                ) -> tuple[int, dict, str]:
    """``accumguard invariance`` through the CLI's entry point in this process (conftest's
    ``accumguard_cli``; the launched ``python -m accumguard.cli invariance`` process is
    test_failing_command_after_steps')."""
    out = tmp_path / f"{name}.json"
    code, stdout, stderr = cli(
        "invariance", "--ks", "1,4", "--batch", "8", "--steps", "2", "--timeout", str(TIMEOUT),
        "--json", str(out), *extra, "--", *command, env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = stdout + stderr
    assert out.exists(), text
    return code, json.loads(out.read_text()), text


def test_f5_token_mean_diverges_at_step_1(tmp_path: Path, accumguard_cli: Any) -> None:
    code, report, text = _invariance(
        accumguard_cli, tmp_path, "f5",
        [sys.executable, str(SCRIPT), "--accum", "{K}", "--micro-batch", "{MB}", "--normalise",
         "mean"], "--plot", str(tmp_path / "f5.png"))
    assert code == 1, text
    assert report["first_divergent_step"] == 1
    comp = report["comparisons"][0]
    # Mean of micro-batch means vs the mean over the batch: far beyond fp32 rounding.
    assert comp["steps"][0]["update_rel_diff"] > 1e-2
    assert [s["backwards_ref"] for s in comp["steps"]] == [[1], [1]]
    assert [s["backwards"] for s in comp["steps"]] == [[4], [4]]
    assert "DIVERGED: K=4 differs from K=1 from step 1 on" in text
    # F5 breaks no boundary rule, but watch's loss record names it for that run (it reads
    # the per-token weights of the script's cross_entropy calls).
    assert "4" in report["findings"]
    assert {f["cls"] for f in report["findings"]["4"] if f["severity"] == "error"} == {"F5"}
    assert "watch findings for the K=4 run:" in text
    assert (tmp_path / "f5.png").read_bytes()[:4] == b"\x89PNG"


def test_sum_over_count_agrees(tmp_path: Path, accumguard_cli: Any) -> None:
    code, report, text = _invariance(
        accumguard_cli, tmp_path, "sum",
        [sys.executable, str(SCRIPT), "--accum", "{K}", "--micro-batch", "{MB}", "--normalise",
         "sum"])
    assert code == 0, text
    assert report["diverged"] is False and report["first_divergent_step"] is None
    # fp32 rounding only (measured ~3e-7), far under the 1e-4 tolerance.
    assert report["comparisons"][0]["max_update_rel_diff"] < 1e-5
    assert report["runs"][1]["micro_batch"] == 2
    # the step records carry the parameters' dtype: the tolerance is derived from it
    assert [r["param_dtype"] for r in report["runs"]] == ["float32", "float32"]
    assert report["tolerance_reason"].startswith("float32 parameters")


def test_ddp_no_sync_two_ranks_agrees(tmp_path: Path, accumguard_cli: Any) -> None:
    # No placeholders: the script reads ACCUMGUARD_K / ACCUMGUARD_MICRO_BATCH.
    code, report, text = _invariance(
        accumguard_cli, tmp_path, "ddp", _torchrun(str(SCRIPT), "--normalise", "sum"))
    assert code == 0, text
    assert [r["world_size"] for r in report["runs"]] == [2, 2]
    steps = report["comparisons"][0]["steps"]
    assert [s["backwards"] for s in steps] == [[4, 4], [4, 4]]
    assert report["comparisons"][0]["max_update_rel_diff"] < 1e-5


def test_boundary_bug_gets_watch_findings(tmp_path: Path, accumguard_cli: Any) -> None:
    """zero_grad before every micro-step (F3): diverges, and watch's finding is attached."""
    code, report, text = _invariance(
        accumguard_cli, tmp_path, "f3",
        [sys.executable, str(SCRIPT), "--accum", "{K}", "--micro-batch", "{MB}",
         "--zero-grad-each-micro"])
    assert code == 1, text
    assert report["first_divergent_step"] == 1
    classes = {f["cls"] for f in report["findings"]["4"] if f["severity"] == "error"}
    assert classes & {"F3", "F2/F3"}, report["findings"]
    # one numbering: watch's findings count optimizer steps from 1, like the table
    assert {f["step"] for f in report["findings"]["4"] if f["severity"] == "error"} == {1}
    assert "watch findings for the K=4 run:" in text


def test_failing_command_after_steps(tmp_path: Path) -> None:
    code = subprocess.run(
        [sys.executable, "-m", "accumguard.cli", "invariance", "--ks", "1,4", "--batch", "8",
         "--steps", "2", "--", sys.executable, str(SCRIPT), "--accum", "{K}",
         "--micro-batch", "{MB}", "--normalise", "bogus"],
        capture_output=True, text=True, timeout=TIMEOUT)
    assert code.returncode == 2
    assert "K=1: the command exited with code 2" in code.stderr


def test_bootstrap_chain_installs_seed_and_dropout_hooks(tmp_path: Path) -> None:
    """The one bootstrap (the observation layer's) applies invariance's seed and dropout
    hooks and runs the environment's own sitecustomize; in the child, dropout is the
    identity and torch is seeded."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    opts = inv.InvarianceOptions(command=("python",), ks=(1, 4), steps=1, no_dropout=True,
                                 seed=5)
    env = inv_run._child_env(opts, 4, 2, tmp_path / "obs")
    assert not any("invariance_bootstrap" in part for part in env["PYTHONPATH"].split(os.pathsep))
    env["PYTHONPATH"] += os.pathsep + str(own)
    code = ("import os, torch\n"
            "x = torch.ones(100)\n"
            "assert torch.equal(torch.nn.Dropout(0.5).train()(x), x), 'dropout still on'\n"
            "a = torch.rand(2)\n"
            "torch.manual_seed(5)\n"
            "assert torch.equal(a, torch.rand(2)), 'not seeded'\n"
            "assert os.environ.get('OWN_SITECUSTOMIZE') == 'ran', 'chain broken'\n"
            "print('hooks ok', os.environ['ACCUMGUARD_K'], os.environ['ACCUMGUARD_MICRO_BATCH'])\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "hooks ok 4 2" in proc.stdout


def test_child_env_defaults(tmp_path: Path) -> None:
    opts = inv.InvarianceOptions(command=("python",), ks=(1, 4), steps=1)
    env = inv_run._child_env(opts, 1, None, tmp_path / "obs")
    assert "ACCUMGUARD_NO_DROPOUT" not in env and env["ACCUMGUARD_K"] == "1"
    assert env["ACCUMGUARD_RECORD_UPDATES"] == "1" and env["ACCUMGUARD_MAX_STEPS"] == "1"


def test_lightning_first_step_is_compared_like_any_other(tmp_path: Path,
                                                         accumguard_cli: Any) -> None:
    """Issue 23: under Lightning (automatic optimisation: forward and backward inside the
    closure given to optimizer.step) the K=1 run's first update was not recorded, and a
    correct script read "DIVERGED at step 1, relative update difference inf ... updated
    only at K=4" although every later step agreed to 5e-7."""
    import pytest

    pytest.importorskip("pytorch_lightning")
    script = SCRIPT.parent / "lightning_regression.py"
    code, report, text = _invariance(accumguard_cli, tmp_path, "pl",
                                     [sys.executable, str(script), "--accum", "{K}",
                                      "--micro-batch", "{MB}"])
    assert code == 0, text
    steps = report["comparisons"][0]["steps"]
    assert [s["backwards_ref"] for s in steps] == [[1], [1]]
    assert all(s["decided_by"] == "update" and s["update_rel_diff"] < 1e-5 for s in steps), steps
    assert "updated only at" not in text, text
