"""``accumguard invariance`` (the CLI, as a user runs it) on hand-written RL-style losses
(tests/invariance_scripts/rl_losses.py: ``log_softmax`` + ``gather``, no
``cross_entropy``), plain ``python``, K=1 against K=4 at one effective batch.

* GRPO-style, the completion-token normaliser tied to a "generation batch" of 2
  micro-batches instead of the optimizer step (the TRL ``steps_per_generation`` mismatch:
  0.5x at K=1, 2x at K=4): DIVERGED from step 1; the same loss over the window's own
  tokens agrees. (A normaliser spanning two optimizer steps *at every K* is the same at
  every K and invariance cannot see it: ``watch``'s log-prob selection rule does.)
* DPO-style, the pairs' mean per micro-batch / K with equal pairs per micro-batch agrees
  (correct, and no watch error on either run); the same not divided by K diverges.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "invariance_scripts" / "rl_losses.py"
TIMEOUT = 300


def _invariance(cli: Any, tmp_path: Path, *script_args: str) -> tuple[int, dict, str]:
    """The CLI's entry point in this process (conftest's ``accumguard_cli``), the command's
    own output passing through as it does from a launched CLI."""
    out = tmp_path / "report.json"
    code, stdout, stderr = cli(
        "invariance", "--ks", "1,4", "--batch", "8", "--steps", "2", "--timeout", str(TIMEOUT),
        "--json", str(out), "--", sys.executable, str(SCRIPT), "--accum", "{K}",
        "--micro-batch", "{MB}", *script_args,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = stdout + stderr
    assert out.exists(), text
    return code, json.loads(out.read_text()), text


def _errors(report: dict) -> set[str]:
    return {f["cls"] for fs in report.get("findings", {}).values() for f in fs
            if f["severity"] == "error"}


@pytest.mark.parametrize(("args", "diverges"), [
    (("--loss", "grpo", "--norm", "generation"), True),
    (("--loss", "grpo", "--norm", "window"), False),
    (("--loss", "dpo", "--norm", "mean"), False),
    (("--loss", "dpo", "--norm", "no_k"), True),
])
def test_rl_losses_under_invariance(tmp_path: Path, args: tuple[str, ...], diverges: bool,
                                    accumguard_cli: Any) -> None:
    code, report, text = _invariance(accumguard_cli, tmp_path, *args)
    steps = report["comparisons"][0]["steps"]
    if diverges:
        assert code == 1, text
        assert report["first_divergent_step"] == 1, text
        assert steps[0]["update_rel_diff"] > 0.5, steps  # a scale error, not rounding
        assert "DIVERGED: K=4 differs from K=1 from step 1 on" in text
    else:
        assert code == 0, text
        assert max(s["update_rel_diff"] for s in steps) < 1e-4, steps
        assert "OK: every K agrees with K=1" in text
        assert _errors(report) == set(), report.get("findings")
