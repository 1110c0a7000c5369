"""Parameters DDP does not reduce, seen where the step's checksum is not kept (blind round 97
a_b03): a Lightning module keeps learned task weights in a config dataclass, not a registered
submodule; the optimizer steps them, DDP never averages their gradients. Lightning runs the
backward inside the optimizer's step closure, so the step's gradient checksum (what the
F10 comparison across ranks used) is not recorded: silent. The observer now reads the
``.grad`` of those few parameters right after the step; the ranks' sums differ: F10 naming
them (on the run's recording, 2 gloo ranks, five steps). The twin that registers the module
is silent. In process: a fault in that read switches observation off and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from tests.helpers import judge_recorded


def test_task_weights_outside_ddp_are_f10() -> None:
    errors = [f for f in judge_recorded("r97_lightning_loss_weights_outside_ddp")
              if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "parameters DDP does not reduce" in errors[0].title
    assert "read after the step" in errors[0].evidence


def test_task_weights_registered_are_silent() -> None:
    findings = judge_recorded("r97_lightning_loss_weights_registered")
    assert not [f for f in findings if f.severity == "error"], findings


def _loop() -> list[torch.Tensor]:
    """DDP (one-rank group) and a weight outside it in the optimizer, K = 2."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(torch.nn.Linear(4, 3))
    scale = torch.nn.Parameter(torch.ones(()))
    opt = torch.optim.SGD([*ddp.parameters(), scale], lr=0.1)
    g = torch.Generator().manual_seed(2)
    for _ in range(4):
        for m in range(2):
            x, y = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
            with ddp.no_sync() if m == 0 else torch.enable_grad():
                (F.cross_entropy(ddp(x) * scale, y) / 2).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in [*ddp.parameters(), scale]]


def test_a_fault_reading_the_loose_gradients_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from accumguard.observe._steps import StepMachinery
    from accumguard.watch._recording import recording

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain = _loop()
        calls: list[int] = []

        def broken(self: StepMachinery, opt: object) -> list[float] | None:
            calls.append(1)
            raise RuntimeError("injected: the loose parameters' gradients")

        monkeypatch.setattr(StepMachinery, "_loose_grads", broken)
        with recording(tmp_path) as obs:
            seen = _loop()
            failure = obs.failure
    finally:
        dist.destroy_process_group()
    assert calls, "the read never ran"
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
