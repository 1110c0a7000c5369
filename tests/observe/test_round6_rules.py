"""The round-6 window rules on synthetic step records (the real runs are in
tests/runtime/test_watch_round6.py): where each rule stops judging."""

from __future__ import annotations

from typing import Any

from accumguard.observe.rules import (
    F12_ERROR_FACTOR,
    f12_drift,
    loss_scale_findings,
    low_precision_findings,
    rank_scale_findings,
    windows,
)


def _cons(scale: float = 1.0, wiped: float = 0.0, received: float = 0.0) -> dict[str, Any]:
    return {"params": 4, "wiped": wiped, "stale": 0.0, "received": received, "ok": True,
            "reason": "", "first_wipe": None, "scale": scale}


def _ddp(scale: float, **kw: Any) -> dict[str, Any]:
    w = {"step": 0, "backwards": 4, "engine": "ddp", "sync_micros": [False] * 3 + [True],
         "reductions": 4, "clips": 0, "conservation": _cons(scale)}
    w.update(kw)
    return w


def test_f10_needs_ddp_sync_counted_collectives_and_no_clip() -> None:
    assert [f.cls for f in rank_scale_findings(0, windows([_ddp(2.0)] * 3), 2)] == ["F10"]
    assert [f.cls for f in rank_scale_findings(0, windows([_ddp(0.5)] * 3), 2)] == ["F10"]
    assert rank_scale_findings(0, windows([_ddp(2.0)] * 3), 1) == []  # one rank
    assert rank_scale_findings(0, windows([_ddp(2.0, clips=1)] * 3), 2) == []
    assert rank_scale_findings(0, windows([_ddp(2.0, reductions=0)] * 3), 2) == []
    assert rank_scale_findings(0, windows([_ddp(2.0, engine="fsdp2")] * 3), 2) == []
    assert rank_scale_findings(0, windows([_ddp(1.7)] * 3), 2) == []  # not W, not 1/W
    unsynced = _ddp(2.0, sync_micros=[False] * 4)
    assert rank_scale_findings(0, windows([unsynced] * 3), 2) == []
    noisy = _ddp(2.0, conservation=_cons(2.0, received=0.05))
    assert rank_scale_findings(0, windows([noisy] * 3), 2) == []
    assert [f.severity for f in rank_scale_findings(0, windows([_ddp(1.0)] * 3), 2)] == ["note"]
    # one collective for 4 gradient tensors (a token count all-reduced): no note
    assert rank_scale_findings(0, windows([_ddp(1.0, reductions=1)] * 3), 2) == []


def _bf16(k: int, **kw: Any) -> dict[str, Any]:
    w = {"step": 0, "backwards": k, "source": "torch", "param_dtype": "bfloat16",
         "zero_grads_between": 0, "conservation": _cons()}
    w.update(kw)
    return w


def test_f12_severity_follows_the_derived_threshold() -> None:
    k_err = 4  # u*sqrt(K)/3 >= F12_ERROR_FACTOR * 2u  <=>  K >= (6 * factor)^2
    assert f12_drift(2.0 ** -8, k_err) >= F12_ERROR_FACTOR * 2 * 2.0 ** -8 * (1 - 1e-12)
    assert [f.severity for f in low_precision_findings(0, windows([_bf16(k_err)]))] \
        == ["error"]
    assert [f.severity for f in low_precision_findings(0, windows([_bf16(256)]))] \
        == ["error"]
    assert low_precision_findings(0, windows([_bf16(3)])) == []  # below the floor
    for quiet in (_bf16(32, param_dtype="float32"), _bf16(32, source="deepspeed"),
                  _bf16(32, zero_grads_between=1), _bf16(32, conservation=_cons(wiped=0.5)),
                  _bf16(32, conservation=None)):
        assert low_precision_findings(0, windows([quiet])) == [], quiet


def _mass_window(weight: float, k: int = 4, **kw: Any) -> dict[str, Any]:
    losses = [["t.py:3", 0, m, 6, weight / 6, False, "mean", True, False] for m in range(k)]
    w = {"step": 0, "backwards": k, "losses": losses, "zero_grads_between": 0,
         "conservation": _cons(), "clips": 0}
    w.update(kw)
    return w


def test_loss_not_divided_by_k() -> None:
    ws = windows([_mass_window(1.0)] * 3)
    assert [f.severity for f in loss_scale_findings(0, ws, 4)] == ["error"]
    assert [f.severity for f in loss_scale_findings(0, ws, 4, world=4)] == ["note"]
    assert loss_scale_findings(0, windows([_mass_window(1.0, conservation=_cons(0.25))] * 3),
                               4) == []  # the sum divided by K by hand: correct
    assert loss_scale_findings(0, windows([_mass_window(1.0, conservation=None)] * 3),
                               4) == []  # never checked: not judged
    assert loss_scale_findings(0, windows([_mass_window(0.25)] * 3), 4) == []  # correct


def test_backwards_per_micro_step() -> None:
    two = {"step": 0, "backwards": 8, "forwards": [2, 0] * 4}
    assert windows([two])[0].window == 4
    odd = {"step": 0, "backwards": 8, "forwards": [2, 0, 0, 1, 0, 1, 1, 0]}
    assert windows([odd])[0].window == 8
    summed = {"step": 0, "backwards": 1, "forwards": [4]}
    assert windows([summed])[0].window == 1


def test_no_scale_or_precision_verdict_when_conservation_saw_nothing_in_grad() -> None:
    # gradients moved to fp32 buffers by a post-accumulate hook: conservation is "ok" (nothing
    # wiped between backwards) but unmatched (received ~ 1): neither x K nor F12 may be judged
    unmatched = _cons(received=1.0)
    assert loss_scale_findings(0, windows([_mass_window(1.0, conservation=unmatched)] * 3),
                               4) == []
    assert low_precision_findings(0, windows([_bf16(576, conservation=unmatched)])) == []
