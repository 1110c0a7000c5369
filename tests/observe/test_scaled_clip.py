"""F8 of the GradScaler shape: ``clip_grad_norm_`` before ``scaler.unscale_`` measures the
gradient times the loss scale, so where that norm exceeds max_norm the update is clipped
to max_norm / scale (blind round 18's b11: watch was silent, the guard has the rule).
Recorded in-process as ``accumguard watch`` records, judged by the CLI's function; the
correct twins (unscale first; a clip that does not bite; a disabled scaler) stay silent,
and the run is the plain run, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accumguard.watch import recording
from accumguard.watch._report import judge

K = 4


def _loop(*, unscale_first: bool, max_norm: float, enabled: bool = True
          ) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=enabled)
    g = torch.Generator().manual_seed(1)
    for i in range(3 * K):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        scaler.scale(F.cross_entropy(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            if unscale_first:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _watched(tmp: Path, **kw: object) -> tuple[list[tuple[str | None, str]], bool]:
    plain = _loop(**kw)  # type: ignore[arg-type]
    with recording(tmp):
        seen = _loop(**kw)  # type: ignore[arg-type]
    same = all(torch.equal(plain[k], seen[k]) for k in plain)
    res = judge(tmp, accumulation_steps=K)
    return [(f.failure_class, f.severity) for f in res.findings], same


def test_clip_before_unscale_is_f8(tmp_path: Path) -> None:
    found, same = _watched(tmp_path, unscale_first=False, max_norm=1.0)
    assert same
    assert ("F8", "error") in found


@pytest.mark.parametrize("kw", [
    {"unscale_first": True, "max_norm": 1.0},  # the documented order
    {"unscale_first": False, "max_norm": 1e12},  # a clip that never bites changes nothing
    {"unscale_first": False, "max_norm": 1.0, "enabled": False},  # scale() is identity
], ids=["unscale-first", "clip-not-biting", "scaler-disabled"])
def test_correct_twins_stay_silent(tmp_path: Path, kw: dict[str, object]) -> None:
    found, same = _watched(tmp_path, **kw)
    assert same
    assert not [f for f in found if f[1] == "error"], found


@pytest.mark.parametrize("fault", ["door", "note"])
def test_a_fault_at_the_unscale_changes_nothing_and_is_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """The unscale_ wrapper's new work (reading the loss scale after a clip) runs behind the
    GradScaler.unscale_ patch door: a fault there (injected at the door, or raised by the
    note itself: a scaler whose get_scale fails) leaves the run bit-identical, switches
    observation off and is recorded as accumguard's own failure."""
    import accumguard.observe._patch_torch as patch_torch
    from accumguard.observe._failsafe import ENV_FAULT

    plain = _loop(unscale_first=False, max_norm=1.0)
    if fault == "door":
        monkeypatch.setenv(ENV_FAULT, "GradScaler.unscale_:pre@1")
    else:
        def broken(obs: object, scaler: object) -> None:
            raise RuntimeError("get_scale failed")

        monkeypatch.setattr(patch_torch, "_note_unscale", broken)
    with recording(tmp_path) as obs:
        seen = _loop(unscale_first=False, max_norm=1.0)
        failure = obs.failure
    assert failure is not None and "unscale_" in failure.where
    assert all(torch.equal(plain[k], seen[k]) for k in plain)
