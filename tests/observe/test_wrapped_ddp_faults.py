"""The code this session put in users' processes, faulted: reading a root through a wrapper
that only forwards (Fabric's ``_FabricModule``, here a stand-in of that name holding a DDP
model), and reading the ``.grad`` of stepped parameters outside the wrapped model (a head
kept in a plain dict) at the step. Without a fault both run (the engine is DDP, the loose
gradient is recorded); with one injected, observation switches off, the failure is
accumguard's, and the weights are bit-equal to the unobserved run's."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from accumguard.observe import _forwards, _loose
from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording

K = 2


class _FabricModule(torch.nn.Module):  # the name Fabric's wrapper has
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self._forward_module = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward_module(x)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        self.heads = {"a": torch.nn.Linear(8, 2)}  # a plain dict: DDP never holds it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads["a"](self.trunk(x))


def _train(out: Path | None) -> tuple[list[torch.Tensor], object]:
    torch.manual_seed(0)
    net = _Net()
    trunk, heads = net.trunk, net.heads
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(3, 4, generator=g) for _ in range(3 * K)]
    with recording(out) if out is not None else contextlib.nullcontext() as obs:
        model = _FabricModule(torch.nn.parallel.DistributedDataParallel(net))
        opt = torch.optim.SGD([*model.parameters(), *heads["a"].parameters()], lr=0.1)
        for i, x in enumerate(data):
            (model(x).pow(2).mean() / K).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
        failure = getattr(obs, "failure", None)
    return [p.detach().clone() for p in [*trunk.parameters(), *heads["a"].parameters()]], failure


@pytest.mark.usefixtures("one_rank_group")
def test_read_through_the_wrapper_and_the_loose_gradient(tmp_path: Path) -> None:
    plain, _ = _train(None)
    seen, failure = _train(tmp_path)
    assert failure is None
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    steps = load_recordings(tmp_path).steps[0]
    assert steps[0]["engine"] == "ddp" and steps[0]["loose_checksum"], steps[0]


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("where", ["engine_module", "_loose_untracked"])
def test_a_fault_there_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       where: str) -> None:
    plain, _ = _train(None)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"injected into {where}")

    if where == "engine_module":
        monkeypatch.setattr(_forwards, "engine_module", broken)
    else:
        monkeypatch.setattr(_loose.LooseParameters, "_loose_untracked", broken)
    seen, failure = _train(tmp_path)
    assert failure is not None and f"injected into {where}" in failure.error, failure
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
