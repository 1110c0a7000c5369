"""``accumguard invariance`` (the real CLI) on bf16 and on scripts that are not K-invariant
by construction (tests/invariance_scripts/precision_inv.py).

Measured here (one rank, SGD, batch 512, 3 steps, K = 1 vs K = 256): a bf16 model whose
micro-gradients are summed in fp32 masters differs from K = 1 by 2.3e-3 to 2.6e-3 per step
(the bf16 rounding of the gradient itself: K = 1 rounds the full gradient once, K = 256
each micro-gradient); summed in the bf16 .grad and copied at the boundary, 1.7e-2 to
1.9e-2 (7x more). The derived bound is 1e-4 + 2u = 7.9e-3: the first agrees, the second
diverges with F12 attached. Before the derived bound both read DIVERGED at 1e-4 (fp32
weights), and a BatchNorm or in-batch-negatives script read DIVERGED too.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "invariance_scripts" / "precision_inv.py"


def _invariance(cli: Any, tmp_path: Path, mode: str, ks: str) -> tuple[int, dict, str]:
    """The CLI's entry point in this process (conftest's ``accumguard_cli``), the command's
    own output passing through as it does from a launched CLI."""
    out = tmp_path / f"{mode}.json"
    code, stdout, stderr = cli("invariance", "--ks", ks, "--batch", "512", "--timeout", "300",
                               "--json", str(out),
                               "--", sys.executable, str(SCRIPT), mode,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = stdout + stderr
    assert out.exists(), text
    return code, json.loads(out.read_text()), text


@pytest.mark.parametrize(("mode", "ks", "verdict"), [
    ("masters_fp32", "1,256", "agrees"), ("masters_bf16", "1,256", "diverged"),
    ("autocast", "1,4", "agrees"),
    ("bn", "1,4", "construction"), ("contrastive", "1,4", "construction"),
])
def test_invariance_verdicts(tmp_path: Path, mode: str, ks: str, verdict: str,
                             accumguard_cli: Any) -> None:
    code, report, text = _invariance(accumguard_cli, tmp_path, mode, ks)
    comp = report["comparisons"][0]
    diffs = [s["update_rel_diff"] for s in comp["steps"]]
    if verdict == "agrees":
        assert code == 0 and not report["diverged"], text
        assert report["tolerance"] == pytest.approx(1e-4 + 2 * 2 ** -8)  # bf16 compute
        assert max(diffs) < 5e-3, diffs
    elif verdict == "diverged":
        assert code == 1 and report["first_divergent_step"] == 1, text
        assert min(diffs) > 1e-2, diffs
        f12 = [f for f in report["findings"]["256"] if f["cls"] == "F12"]
        assert [f["severity"] for f in f12] == ["error"] and "master weights" in f12[0]["evidence"]
        assert report["runs"][1]["low_precision_accumulation"], report["runs"][1]
    else:
        assert code == 0 and not report["diverged"], text
        assert report["not_invariant_by_construction"] and comp["construction"], text
        assert "NOT K-INVARIANT BY CONSTRUCTION" in text and "DIVERGED" not in text
        assert ("BatchNorm1d(32)" if mode == "bn" else "in-batch negatives") in text
        assert not [f for f in report["findings"]["4"] if f["severity"] == "error"]
