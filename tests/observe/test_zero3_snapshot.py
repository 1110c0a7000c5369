"""The update record of a DeepSpeed ZeRO-3 engine reads each parameter's partition without
the padding DeepSpeed leaves uninitialised on the last rank (two runs of the same training
then compare equal; with the padding, ``advise`` and ``invariance`` saw updates "differ" by
2.5e19)."""

from __future__ import annotations

import pytest
import torch

from accumguard.observe import _introspect


def _zero3_param(numel: int, partition: list[float]) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.empty(0))  # ZeRO-3 leaves an empty .data outside a gather
    p.ds_numel = numel  # type: ignore[attr-defined]
    p.ds_tensor = torch.tensor(partition)  # type: ignore[attr-defined]
    return p


class _Engine(torch.nn.Module):
    def __init__(self, p: torch.nn.Parameter) -> None:
        super().__init__()
        self.module = torch.nn.Module()
        self.module.w = p


@pytest.mark.parametrize(("rank", "want"), [(0, [1.0, 2.0, 3.0]), (1, [4.0, 5.0])])
def test_the_last_ranks_padding_is_not_read(monkeypatch: pytest.MonkeyPatch, rank: int,
                                            want: list[float]) -> None:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: rank)
    part = [1.0, 2.0, 3.0] if rank == 0 else [4.0, 5.0, float("nan")]  # 5 elements, 2 ranks
    snap = _introspect.snapshot(None, _Engine(_zero3_param(5, part)), {})
    assert snap["w"].tolist() == want
