"""A run resumed from a checkpoint into a new model and optimizer (blind round 33, writer c:
the saved micro-step counter one too low, so the resumed run's first window holds one
micro-batch and the next holds K; then a large-batch reference with a third optimizer
stepping once per whole batch). The new optimizer's windows, 1 then K, are a tie: it is
not an optimizer stepping at its own rate (a note) but the training's K with an off-by-one
origin (F13); the same resume with whole windows is silent."""

from __future__ import annotations

from pathlib import Path

import torch

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K = 4


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, windows: list[int]) -> None:
    for n in windows:
        for _ in range(n):
            (model(torch.randn(3, 4)).pow(2).mean() / K).backward()
        opt.step()
        opt.zero_grad()


def _resumed(tmp_path: Path, resumed_windows: list[int]) -> list[tuple[str, str]]:
    with recording(tmp_path):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, opt, [K, K])
        state = (model.state_dict(), opt.state_dict())
        again = torch.nn.Linear(4, 1)  # the resume: a new model and optimizer
        again.load_state_dict(state[0])
        opt2 = torch.optim.AdamW(again.parameters(), lr=1e-2)
        opt2.load_state_dict(state[1])
        _train(again, opt2, resumed_windows)
        ref = torch.nn.Linear(4, 1)  # the script's own large-batch reference
        _train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), [1] * 4)
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return [(f.cls, f.severity.value) for f in findings if f.severity.value != "note"]


def test_a_resume_whose_first_window_is_one_micro_batch_is_f13(tmp_path: Path) -> None:
    assert _resumed(tmp_path, [1, K]) == [("F13", "error")]


def test_a_resume_at_a_window_boundary_is_silent(tmp_path: Path) -> None:
    assert _resumed(tmp_path, [K, K]) == []
