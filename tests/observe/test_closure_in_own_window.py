"""A backward run inside ``optimizer.step(closure)`` belongs to that step's window also
when the optimizer's window is its own (several optimizers over disjoint parameters).
Lightning's automatic optimisation runs the window's last micro-step in the closure; a
resumed run (a second Trainer: a new model and optimizer while the first ones live on)
made every window of the new optimizer lose that micro-step, so the window looked one short
with its sync flag off at its last backward (blind round 68 a_c02: a false F11)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, k: int, steps: int) -> None:
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        for i in range(k):
            x, y = torch.randn(4, 5, generator=g), torch.randint(0, 3, (4,), generator=g)

            def micro(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                loss = F.cross_entropy(model(x), y) / k
                loss.backward()
                return loss

            if i < k - 1:
                micro()
            else:
                opt.step(micro)  # the window's last micro-step inside the step
                opt.zero_grad()


def test_the_closures_backward_is_in_the_own_window(tmp_path: Path) -> None:
    torch.manual_seed(0)
    first, second = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    opt1 = torch.optim.SGD(first.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(second.parameters(), lr=0.1)
    with recording(tmp_path):
        _train(first, opt1, 2, 2)
        _train(second, opt2, 4, 2)  # opt1 still alive: each optimizer its own window
    steps = load_recordings(tmp_path).steps[0]
    assert [s["backwards"] for s in steps] == [2, 2, 4, 4], steps
    assert all(s["conservation"]["ok"] for s in steps if s.get("conservation")), steps
    del opt1
