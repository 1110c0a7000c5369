"""The window loss of a step record: the float64 sum of the window's scalar losses, whether
they were read at each backward (CPU losses: one host read each, nothing kept) or kept on
their device and stacked at the step."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.observe._introspect import window_loss
from accumguard.observe.rules import load_recordings
from accumguard.watch._recording import recording


def test_floats_tensors_and_a_mix_sum_alike_in_float64() -> None:
    values = [0.1, 1e8, -1e8, 0.7]
    exact = float(torch.tensor(values, dtype=torch.float64).sum())
    assert window_loss(values) == exact
    assert window_loss([torch.tensor(v, dtype=torch.float64) for v in values]) == exact
    # (a window whose losses sit on two devices: summed in another order, to rounding)
    mixed: list[torch.Tensor | float] = [torch.tensor(0.1, dtype=torch.float64), 2.5, 0.7]
    assert abs(window_loss(mixed) - 3.3) < 1e-12
    assert window_loss([]) == 0.0


def test_a_cpu_window_records_the_sum_of_its_losses(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = torch.randn(6, 5, 4), torch.randint(0, 3, (6, 5))
    sums: list[float] = []
    with recording(str(tmp_path)):
        for step in range(2):
            total = 0.0
            for j in range(3):
                loss = F.cross_entropy(model(xs[3 * step + j]), ys[3 * step + j]) / 3
                total += float(loss.detach().double())
                loss.backward()
            sums.append(total)
            opt.step()
            opt.zero_grad()
    steps = load_recordings(tmp_path).steps[0]
    assert [round(float(s["window_loss"]), 12) for s in steps] == [round(x, 12) for x in sums]
