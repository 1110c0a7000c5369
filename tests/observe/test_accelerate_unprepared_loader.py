"""Accelerate's ``accumulate()`` over a DataLoader that ``accelerator.prepare`` never saw
(blind round 76 a_b03, missed before): Accelerate closes a window at the end of a pass only
over a DataLoader it prepared, so with 10 batches a pass and K = 4 the pass's last 2
micro-batches are carried into the next pass's first window: F7. The same loop over the
prepared DataLoader (passes of whole windows), and one with ``sync_with_dataloader=False``
(windows counted across passes on purpose), say nothing at error level. In-process, one CPU process; the watched
run is the plain run, bit for bit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias
from torch.utils.data import DataLoader, TensorDataset

from accumguard.watch._recording import recording
from accumguard.watch._report import judge

accelerate = pytest.importorskip("accelerate")
K = 4


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    from accelerate.state import AcceleratorState, GradientState

    yield
    GradientState._reset_state()
    AcceleratorState._reset_state(True)


def _loop(form: str) -> list[torch.Tensor]:
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import GradientAccumulationPlugin

    GradientState._reset_state()
    AcceleratorState._reset_state(True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    # 10 batches a pass; 12 for the prepared loader (its short last window would still be
    # divided by K: the partial-window rule's F7, not this one)
    n = 48 if form == "prepared" else 40
    data = TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))
    dl = DataLoader(data, batch_size=4, shuffle=False)
    plugin = GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=form != "no sync")
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    if form == "prepared":
        model, opt, dl = acc.prepare(model, opt, dl)
    else:
        model, opt = acc.prepare(model, opt)
    for _ in range(2):
        for x, y in dl:
            with acc.accumulate(model):
                acc.backward(F.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
    return [p.detach().clone() for p in acc.unwrap_model(model).parameters()]


@pytest.mark.parametrize("form", ["unprepared", "prepared", "no sync"])
def test_a_pass_carried_into_the_next_window_without_a_prepared_loader(
        tmp_path: Path, form: str) -> None:
    plain = _loop(form)
    with recording(tmp_path):
        seen = _loop(form)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    errors = [f for f in judge(tmp_path).findings if f.severity == "error"]
    if form == "unprepared":
        assert [f.failure_class for f in errors] == ["F7"], errors
        assert "2 micro-step(s) from the end of one pass" in errors[0].evidence, errors[0]
        assert "accelerator.prepare" in errors[0].fix
    else:
        assert errors == [], errors
