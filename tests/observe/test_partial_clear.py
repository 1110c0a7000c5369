"""A gradient changed between backward passes by neither ``zero_grad`` nor an engine: a
callback-style hook that zeroes some rows' gradients after every micro-step but the last
(blind round 41 a_b03: an HF ``TrainerCallback.on_substep_end``). Conservation catches it;
the finding says what was measured (part of the gradient removed, no ``zero_grad``) and the
fix names where such code belongs, instead of the class's "last micro-batch only"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS = 4, 3


def _findings(tmp_path: Path, loop: Callable[[], None]) -> list[Finding]:
    with recording(tmp_path):
        loop()
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.severity == "error"]


def _loop(clear: str) -> Callable[[], None]:
    """An embedding whose first rows are meant to stay frozen; ``clear``: "rows" zeroes those
    rows' gradient after micro-steps 1..K-1 only (not after the last), "all" sets every
    gradient to None there, "none" leaves the gradients alone."""
    def run() -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Flatten(),
                                    torch.nn.Linear(8 * 3, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            for m in range(K):
                x = torch.randint(0, 20, (5, 3), generator=g)
                y = torch.randint(0, 4, (5,), generator=g)
                (torch.nn.functional.cross_entropy(model(x), y) / K).backward()
                if m < K - 1 and clear == "rows":
                    model[0].weight.grad[:10] = 0.0
                elif m < K - 1 and clear == "all":
                    for p in model.parameters():
                        p.grad = None
            opt.step()
            opt.zero_grad()
    return run


def test_rows_cleared_by_hand_between_micro_steps_are_said_as_measured(tmp_path: Path) -> None:
    (f,) = _findings(tmp_path, _loop("rows"))
    assert f.cls == "F3", f
    assert "no zero_grad ran" in f.title and "last micro-batch only" not in f.title, f.title
    assert "on_pre_optimizer_step" in f.fix and "requires_grad=False" in f.fix, f.fix


def test_every_gradient_cleared_by_hand_is_still_reported(tmp_path: Path) -> None:
    (f,) = _findings(tmp_path, _loop("all"))
    assert f.cls == "F3", f


@pytest.mark.parametrize("clear", ["none"])
def test_a_loop_that_clears_nothing_is_silent(tmp_path: Path, clear: str) -> None:
    assert _findings(tmp_path, _loop(clear)) == []
