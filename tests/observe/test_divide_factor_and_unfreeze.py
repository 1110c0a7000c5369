"""Two engine facts of blind round 98 (on the runs' recordings, 2 gloo ranks).

b_b02: FSDP2 with losses summed over the window (no 1/K) and ``set_gradient_divide_factor(K)``,
which replaces FSDP2's division by the world size: every update is W x too large. watch said
LOSS_SCALE "the loss is not divided by K: K x the gradient", a per-rank reading blind to the
engine's factor. The per-rank scale rule now steps aside when the measured reduction factor
is not 1/W, and the ledger, composing it, says F10 with the factor; K x W is silent.

b_b03: DDP built while an embedding was frozen, unfrozen at step 5: DDP's reducer holds only
the parameters that required a gradient when it was built, so the embedding is never
averaged. watch said the generic F11; the observer now notes the parameters frozen at each
DDP's construction: F10 "parameters DDP does not reduce" (the twin wraps again after
unfreezing: silent). In process: a fault in that note changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from tests.helpers import judge_recorded


def test_divide_factor_k_is_f10_with_the_factor() -> None:
    errors = [f for f in judge_recorded("r98_fsdp2_divide_factor_k") if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "set_gradient_divide_factor(4)" in errors[0].evidence
    assert "K x W" in errors[0].fix


def test_divide_factor_k_w_is_silent() -> None:
    findings = judge_recorded("r98_fsdp2_divide_factor_k_w")
    assert not [f for f in findings if f.severity == "error"], findings


def test_unfrozen_after_wrapping_is_f10() -> None:
    errors = [f for f in judge_recorded("r98_ddp_unfrozen_after_wrapping") if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "frozen then and unfrozen later" in errors[0].evidence


def test_rewrapped_after_unfreezing_is_silent() -> None:
    findings = judge_recorded("r98_ddp_rewrapped_after_unfreezing")
    assert not [f for f in findings if f.severity == "error"], findings


def _loop() -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 3))
    net[0].weight.requires_grad_(False)
    ddp = DDP(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        (F.cross_entropy(ddp(torch.randn(5, 4, generator=g)), torch.randint(0, 3, (5,), generator=g))
         ).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()]


def test_a_fault_noting_the_frozen_parameters_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from accumguard.watch._recording import recording

    class Broken(dict):  # type: ignore[type-arg]
        def __setitem__(self, key: object, value: object) -> None:
            raise RuntimeError("injected: the parameters frozen at DDP's construction")

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain = _loop()
        with recording(tmp_path) as obs:
            obs.ddp_frozen = Broken()
            seen = _loop()
            failure = obs.failure
    finally:
        dist.destroy_process_group()
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
