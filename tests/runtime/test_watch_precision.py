"""F12 on real runs (K = 256): where the gradient really accumulates. A bf16 model's own
.grad, a bf16 .grad behind fp32 master weights, FSDP2 MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=bf16) with sync off between micro-steps, DeepSpeed ZeRO-2 bf16 without
``grad_accum_dtype``: errors naming the fix for that engine. Their correct twins (fp32
master gradients summed per micro-step, bf16 autocast over fp32 parameters, accumguard's
Accumulator, FSDP2 reduce_dtype=fp32, DeepSpeed ``grad_accum_dtype: fp32``) have no error.

One process start per engine family (``tests/watch_scripts/precision.py --sweep``), and one
launch of the real ``accumguard watch`` CLI. DeepSpeed on CPU supports bf16 (0.19.8:
``is_bf16_supported()`` is True), so ZeRO-2 bf16 runs here for real.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_watch import SCRIPTS, _classes, _sweep, _torchrun, _watch

# K = 256: the script's default (PRECISION_K)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("precision_plain")
    return _sweep(out, [sys.executable, str(SCRIPTS / "precision.py"), "--sweep", str(out),
                        "bf16_plain", "master", "master_ok", "autocast", "accumulator"],
                  timeout=400)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("precision_dist")
    return _sweep(out, _torchrun("precision.py", "--sweep", str(out), "fsdp_bf16", "fsdp_fp32",
                                 "ds_bf16", "ds_fp32"), timeout=600)


@pytest.mark.parametrize(("name", "expected", "fix"), [
    ("bf16_plain", {"F12"}, "torch.autocast"),
    ("master", {"F12"}, "fp32 master's .grad right after its backward"),
    ("master_ok", set(), None), ("autocast", set(), None), ("accumulator", set(), None),
])
def test_single_process(plain: Path, name: str, expected: set[str], fix: str | None) -> None:
    errors, _, findings = _classes(plain, name)
    assert errors == expected, findings
    if fix:
        f = next(f for f in findings if f.cls == "F12")
        assert fix in f.fix and "256 backward passes" in f.evidence, f


@pytest.mark.parametrize(("name", "expected", "fix"), [
    ("fsdp_bf16", {"F12"}, "reduce_dtype=torch.float32"), ("fsdp_fp32", set(), None),
    ("ds_bf16", {"F12"}, '"grad_accum_dtype": "fp32"'), ("ds_fp32", set(), None),
])
def test_two_ranks(dist: Path, name: str, expected: set[str], fix: str | None) -> None:
    errors, notes, findings = _classes(dist, name)
    assert errors == expected, findings
    if fix:
        f = next(f for f in findings if f.cls == "F12")
        assert fix in f.fix, f
    else:  # the twin: bf16 compute seen, the sum said to be fp32
        assert notes == {"F12"} and "no low-precision accumulation" in findings[0].evidence


def test_watch_cli_master_weights(tmp_path: Path) -> None:
    """The real CLI on the unmodified script: bf16 grads summed behind fp32 masters."""
    code, findings, report, proc = _watch(tmp_path, [sys.executable,
                                                     str(SCRIPTS / "precision.py"), "master"])
    assert proc.stdout.strip() == "trained", proc.stderr[-2000:]
    assert code == 1 and report["accumulation_steps"] == 256
    f12 = [f for f in findings if f["cls"] == "F12"]
    assert [f["severity"] for f in f12] == ["error"], findings
    assert "master weights" in f12[0]["evidence"]
