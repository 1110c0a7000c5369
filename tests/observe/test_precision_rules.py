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
    assert f12_error_k() == 4


def test_master_weights_bf16_sum_behind_fp32_optimizer() -> None:
    assert _sev(_master(256)) == [("F12", "error")]
    f = low_precision_findings(0, windows([_master(256)]))[0]
    assert "master" in f.evidence and "256 backward passes" in f.evidence
    assert "fp32 master's .grad right after its backward" in f.fix
    assert _sev(_master(4)) == [("F12", "error")]
    assert _sev(_master(3)) == []  # windows of 2-3: below the floor, not reported
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
    assert _sev(_fsdp([False] * 3 + [True], "bfloat16")) == [("F12", "error")]
    assert _sev(_fsdp([False] * 2 + [True], "bfloat16")) == []
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
    assert _sev(_ds(8, "bfloat16")) == [("F12", "error")]
    assert _sev(_ds(3, "bfloat16")) == []
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
    assert _sev(_w(16, param_dtype="bfloat16", conservation=_cons())) == [("F12", "error")]
    assert _sev(_w(3, param_dtype="bfloat16", conservation=_cons())) == []


def test_live_findings_carry_f12_for_the_callbacks() -> None:
    """The framework callbacks judge each window with live_findings: F12 is among them
    (errors and warnings; the fp32 twin's note is left to watch)."""
    from accumguard.observe.rules import live_findings

    bug = dict(_ds(256, "bfloat16"), step=3)
    assert [(f.cls, f.severity) for f in live_findings(bug, rank=None, k=256)] \
        == [("F12", "error")]
    assert live_findings(dict(_ds(256, "float32"), step=3), rank=0, k=256) == []


# -- the drift measured on the sum (AccumDrift: a sample shadowed in fp32) ----------------

def _measured(w: dict[str, Any], sums: int, drift: float) -> dict[str, Any]:
    prec = dict(w["precision"], drift={"dtype": "bfloat16", "sums": sums, "drift": drift,
                                       "elements": 384})
    return dict(w, precision=prec)


def test_a_measured_drift_decides_the_level() -> None:
    """FSDP2 reduce_dtype=bf16 at K = 128: the expectation alone is an error (K >= 4); the
    drift measured on the sum of 127 micro-gradients replaces it: 0.012 (3.1 u) is an error
    that says so; a measurement below u/3 (a sum that barely rounded) is a warning even
    where the expectation says error: the measurement is the evidence."""
    u = 2.0 ** -8
    k128 = _fsdp([False] * 127 + [True], "bfloat16")
    assert _sev(k128) == [("F12", "error")]
    assert _sev(_measured(k128, 127, 0.012)) == [("F12", "error")]
    f = low_precision_findings(0, windows([_measured(k128, 127, 0.012)]))[0]
    assert "differs from their fp32 sum by 0.012" in f.evidence and "3.1 u" in f.evidence
    assert "The large batch sums its gradient once in fp32" in f.evidence
    assert "reduce_dtype=torch.float32" in f.fix
    assert _sev(_measured(k128, 127, 0.3 * u)) == [("F12", "warning")]
    k256 = _fsdp([False] * 255 + [True], "bfloat16")
    assert _sev(_measured(k256, 255, 0.3 * u)) == [("F12", "warning")]
    # several windows: the smallest drift at the longest sum decides
    other = dict(_measured(k128, 127, 0.3 * u), step=1)
    assert _sev(_measured(k128, 127, 0.02)) == [("F12", "error")]
    assert [(f.cls, f.severity) for f in low_precision_findings(
        0, windows([_measured(k128, 127, 0.02), other]))] == [("F12", "warning")]


def test_a_measurement_behind_a_changed_grad_is_not_used() -> None:
    """A zero_grad or a clip between the backwards changed .grad behind the shadow: the
    measurement (here a drift of 0, which alone would be a warning) says nothing about
    rounding, the expectation decides (an error at 128)."""
    k128 = _fsdp([False] * 127 + [True], "bfloat16")
    assert _sev(_measured(k128, 127, 0.0)) == [("F12", "warning")]
    cleared = dict(_measured(k128, 127, 0.0), zero_grads_between=1)
    assert _sev(cleared) == [("F12", "error")]
    clipped = dict(_measured(k128, 127, 0.0), clip_micros=[3])
    assert _sev(clipped) == [("F12", "error")]


def _bf16_run(tmp: Any, k: int, watched: bool, steps: int = 2,
              hooks: list[int] | None = None) -> list[Any]:
    import torch
    import torch.nn.functional as F  # noqa: N812

    from accumguard.watch._recording import recording

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4)).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with recording(tmp) if watched else _nothing() as obs:
        for _ in range(steps):
            for _ in range(k):
                x, y = torch.randn(2, 8, generator=g), torch.randint(0, 4, (2,), generator=g)
                (F.cross_entropy(model(x.bfloat16()).float(), y) / k).backward()
            if hooks is not None and obs is not None:  # the drift hooks on in this window
                hooks.append(sum(len(p._backward_hooks or {}) for p in model.parameters()))
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


class _nothing:  # noqa: N801 - a null context manager, as recording() is used
    def __enter__(self) -> Any:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize(("k", "level"), [(2, None), (128, "error")])
def test_the_drift_is_measured_on_a_bf16_model(tmp_path: Any, k: int,
                                               level: str | None) -> None:
    """A bf16 model's own .grad summing K micro-gradients, recorded in process: at K = 128
    the measured drift (about 1.1e-2 here, on 127 sums) is beyond 1.2 x 2u: an error (the expectation
    alone, 0.015 < 2 x 2u, was a warning); at K = 2 nothing is reported. The recorded run's
    parameters are bit-identical to the unrecorded run's."""
    from accumguard.watch._findings import analyze, load_recordings

    watched = _bf16_run(tmp_path, k, True)
    plain = _bf16_run(tmp_path / "unused", k, False)
    import torch

    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    rec = load_recordings(tmp_path)
    drifts = [s["precision"].get("drift") for s in rec.steps[0]]
    # measured before each addition: K - 1 sums (one at K = 2: nothing to measure)
    assert all(d["sums"] == k - 1 and d["dtype"] == "bfloat16" for d in drifts) if k > 2 \
        else drifts == [None, None], drifts
    found = [f for f in analyze(rec)[0] if f.cls == "F12"]
    assert [f.severity.value for f in found] == ([level] if level else []), found
    if level:
        assert "measured on" in found[0].evidence and "torch.autocast" in found[0].fix


def test_the_drift_is_sampled_on_a_schedule(tmp_path: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The shadow runs in the first two windows, then at doubling gaps (windows 2, 4, 8)
    within its budget; in the other windows its hooks are off (no per-backward work) and the
    window has no measurement. Past its budget only the first windows are measured. The run
    stays bit-identical to the unrecorded one, and F12 is still measured (an error at K =
    128 from the first windows alone)."""
    import torch

    from accumguard.observe import _precision
    from accumguard.watch._findings import analyze, load_recordings

    monkeypatch.setattr(_precision, "_DRIFT_BUDGET", 1e9)
    hooks: list[int] = []
    watched = _bf16_run(tmp_path / "a", 8, True, steps=10, hooks=hooks)
    plain = _bf16_run(tmp_path / "unused", 8, False, steps=10)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    measured = [i for i, s in enumerate(load_recordings(tmp_path / "a").steps[0])
                if s["precision"].get("drift")]
    assert measured == [0, 1, 2, 4, 8], measured
    assert [i for i, n in enumerate(hooks) if n] == measured, hooks
    monkeypatch.setattr(_precision, "_DRIFT_BUDGET", 0.0)
    _bf16_run(tmp_path / "b", 128, True, steps=4)
    rec = load_recordings(tmp_path / "b")
    assert [bool(s["precision"].get("drift")) for s in rec.steps[0]] == [True, True, False,
                                                                           False]
    assert [f.severity.value for f in analyze(rec)[0] if f.cls == "F12"] == ["error"]


@pytest.mark.parametrize("cleared", [False, True])
def test_model_grad_sum_tells_a_grad_cleared_between_backwards(cleared: bool) -> None:
    """The master-weight pattern's "summed in place" (``model_grad_sum``) on real checksums
    of a bf16 parameter: a .grad moved to an fp32 buffer and set to None after every
    backward (a correct loop) is not in place. Its signed sums cancel to about 1/sqrt(n) of
    its absolute sum (2 % at 64 x 64), under the 3 % tolerance: comparing them alone called
    this loop a bf16 sum (blind round 23, a false F12 warning)."""
    import torch

    from accumguard.observe._checksum import checksums
    from accumguard.observe._precision import model_grad_sum

    torch.manual_seed(0)
    p = torch.zeros(64, 64, dtype=torch.bfloat16, requires_grad=True)
    master = torch.zeros(64, 64, requires_grad=True)
    starts, ends = [], []
    for _ in range(4):
        if cleared:
            p.grad = None
        starts.append(checksums([p]))
        g = torch.randn(64, 64).bfloat16()
        p.grad = g if p.grad is None else p.grad + g
        ends.append(checksums([p]))
    master.grad = p.grad.float()
    out = model_grad_sum([p], [False], starts, ends, [master])
    assert out is not None and out["in_place"] is (not cleared), out
