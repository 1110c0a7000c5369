"""A window skipped on purpose (blind round 105 c_b02_fixed, a false F8 before): a loop that
clips at each window's end and, when the norm spikes, clears the gradient instead of
stepping. The clip of the skipped window then sits inside the tally of the next optimizer
step (two windows of K backwards, a zero_grad between them), but it acted on the gradient
the clear discarded: no F8, no F3. Without the clear (the bug) the skipped window's clipped
gradient leaks into the next window: an error. In one process, every window recorded."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, SKIP = 4, 4, 1


def _loop(clear: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    for window in range(STEPS):
        for _ in range(K):
            x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
            (F.cross_entropy(model(x), y) / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if window == SKIP:  # a spike: the window is not applied
            if clear:
                opt.zero_grad(set_to_none=True)
            continue
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def _errors(tmp_path: Path, clear: bool) -> list[Finding]:
    plain = _loop(clear)
    with recording(tmp_path):
        seen = _loop(clear)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.severity == "error"]


def test_a_window_skipped_and_cleared_is_silent(tmp_path: Path) -> None:
    assert _errors(tmp_path, clear=True) == []


def test_a_window_skipped_without_a_clear_leaks_into_the_next(tmp_path: Path) -> None:
    assert _errors(tmp_path, clear=False) != []
