"""F12 on recorded windows: where the window's gradient was really summed (the plain bf16
.grad, master weights, FSDP2's deferred unsharded gradient, DeepSpeed's accumulation
buffer), the severity at the run's K, and the correct twins that must stay silent at error
level. The real runs are in tests/runtime/test_watch_precision.py."""

from __future__ import annotations

from typing import Any

import pytest

from accumguard.observe._precision_rules import f12_error_k
from accumguard.observe.rules import low_precision_findings, windows


def _cons(**kw: Any) -> dict[str, Any]:
    c = {"params": 4, "wiped": 0.0, "stale": 0.0, "received": 0.0, "ok": True, "reason": "",
         "first_wipe": None, "scale": 1.0}
    c.update(kw)
    return c


def _w(k: int, **kw: Any) -> dict[str, Any]:
    w: dict[str, Any] = {"step": 0, "backwards": k, "source": "torch", "param_dtype": "float32",
                         "zero_grads_between": 0, "conservation": None}
    w.update(kw)
    return w


def _sev(w: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f.cls, f.severity) for f in low_precision_findings(0, windows([w]))]


def _master(k: int, **kw: Any) -> dict[str, Any]:
    mg = {"dtype": "bfloat16", "sums": k, "in_place": True, "reached": True, "scale": 1.0}
    mg.update(kw)
    return _w(k, precision={"compute": "bfloat16", "model_grad": mg})


def test_error_threshold_is_derived() -> None:
    assert f12_error_k() == 144


def test_master_weights_bf16_sum_behind_fp32_optimizer() -> None:
    assert _sev(_master(256)) == [("F12", "error")]
    f = low_precision_findings(0, windows([_master(256)]))[0]
    assert "master" in f.evidence and "256 backward passes" in f.evidence
    assert "fp32 master's .grad right after its backward" in f.fix
    assert _sev(_master(32)) == [("F12", "warning")]
    # not paired with the optimizer's gradients: never an error
    assert _sev(_master(256, reached=None)) == [("F12", "warning")]
    # correct twins: each micro-step moved to fp32 (wiped in between), or the sum never
    # reached the optimizer
    assert _sev(_master(256, in_place=False)) == []
    assert _sev(_master(256, reached=False)) == []
    assert _sev(_master(256, dtype="float32")) == []


def _fsdp(flags: list[bool | None], deferred: str, compute: str = "bfloat16") -> dict[str, Any]:
    return _w(len(flags), engine="fsdp2", sync_micros=flags,
              precision={"compute": compute, "fsdp": {"compute": compute, "deferred": deferred,
                                                      "synced": "float32"}})


def test_fsdp2_reduce_dtype() -> None:
    deferred = [False] * 255 + [True]
    assert _sev(_fsdp(deferred, "bfloat16")) == [("F12", "error")]
    f = low_precision_findings(0, windows([_fsdp(deferred, "bfloat16")]))[0]
    assert "reduce_dtype=torch.float32" in f.fix and "FSDP2" in f.evidence
    assert _sev(_fsdp([False] * 15 + [True], "bfloat16")) == [("F12", "warning")]
    # correct twins: fp32 reduce_dtype (a note only), sync on every micro-step (each
    # micro-step's reduced shard is added in the fp32 sharded gradient), unknown flags
    assert _sev(_fsdp(deferred, "float32")) == [("F12", "note")]
    assert _sev(_fsdp([True] * 256, "bfloat16")) == []
    assert _sev(_fsdp([None] * 256, "bfloat16")) == []


def _ds(k: int, accum: str) -> dict[str, Any]:
    return _w(k, source="deepspeed", engine="deepspeed", param_dtype="bfloat16",
              precision={"compute": "bfloat16", "deepspeed": {
                  "compute": "bfloat16", "accum": accum, "optimizer": "DeepSpeedZeroOptimizer"}})


def test_deepspeed_grad_accum_dtype() -> None:
    assert _sev(_ds(256, "bfloat16")) == [("F12", "error")]
    f = low_precision_findings(0, windows([_ds(256, "bfloat16")]))[0]
    assert '"grad_accum_dtype": "fp32"' in f.fix
    assert _sev(_ds(8, "bfloat16")) == [("F12", "warning")]
    assert _sev(_ds(256, "float32")) == [("F12", "note")]
    assert _sev(_ds(2, "bfloat16")) == []


@pytest.mark.parametrize("quiet", [
    _w(256, param_dtype="float32", precision={"compute": "bfloat16", "autocast": "bfloat16"}),
    _w(256, param_dtype="bfloat16", conservation=_cons(wiped=0.5)),  # fp32 buffer pattern
    _w(256, param_dtype="bfloat16", conservation=_cons(received=1.0)),  # hook moved grads
    _w(256, param_dtype="bfloat16", conservation=None),  # never checked
])
def test_correct_twins_stay_silent(quiet: dict[str, Any]) -> None:
    assert [s for s in _sev(quiet) if s[1] != "note"] == []


def test_plain_bf16_params() -> None:
    assert _sev(_w(256, param_dtype="bfloat16", conservation=_cons())) == [("F12", "error")]
    assert _sev(_w(16, param_dtype="bfloat16", conservation=_cons())) == [("F12", "warning")]


def test_live_findings_carry_f12_for_the_callbacks() -> None:
    """The framework callbacks judge each window with live_findings: F12 is among them
    (errors and warnings; the fp32 twin's note is left to watch)."""
    from accumguard.observe.rules import live_findings

    bug = dict(_ds(256, "bfloat16"), step=3)
    assert [(f.cls, f.severity) for f in live_findings(bug, rank=None, k=256)] \
        == [("F12", "error")]
    assert live_findings(dict(_ds(256, "float32"), step=3), rank=0, k=256) == []
