"""A clip given tensors that hold no gradient (blind round 76 b_b01: FSDP2, then
``clip_grad_norm_([p.grad.to_local() for p in model.parameters()], max_norm)``, missed
before): ``clip_grad_norm_`` reads each tensor's ``.grad``, the local shards have none, so
it clips nothing and the optimizer steps on the unclipped gradient. F8, said from what the
clip was given. The correct twin (the DTensor parameters themselves, the global norm) and a
loop clipping its parameters stay silent; the watched run is the plain run, bit for bit.
One real FSDP2 rank on gloo, in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.watch._recording import recording
from accumguard.watch._report import judge

K = 2


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from helpers import free_port

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _loop(local_shards: bool) -> list[torch.Tensor]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for i in range(K):
            model.set_requires_gradient_sync(i == K - 1)
            x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            (F.cross_entropy(model(x), y) / K).backward()
        if local_shards:
            shards = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(shards, 0.05)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        opt.zero_grad()
    return [p.detach().full_tensor().clone() for p in model.parameters()]


@pytest.mark.parametrize("local_shards", [True, False])
def test_a_clip_given_the_local_shards_clips_nothing(
        tmp_path: Path, one_rank: None, local_shards: bool) -> None:
    plain = _loop(local_shards)
    with recording(tmp_path):
        seen = _loop(local_shards)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    res = judge(tmp_path, accumulation_steps=K)
    errors = [f for f in res.findings if f.severity == "error"]
    if local_shards:
        assert [f.failure_class for f in errors] == ["F8"], errors
        assert errors[0].title.startswith("gradient clipping clipped nothing"), errors[0]
        assert "4 tensor(s)" in errors[0].evidence
    else:
        assert errors == [], errors
