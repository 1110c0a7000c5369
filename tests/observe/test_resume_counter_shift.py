"""A run stopped right after a step, rebuilt from its checkpoint (new model, new optimizer)
and resumed with its micro-step counter restored one short (blind round 52, c_b03: the
counter saved before its increment): the new optimizer's first window holds 1 of K
micro-batches and the next ones K, every window after the rebuild shifted (F13). The twin
restores the counter right and stays silent. Real runs in this process, judged on the record."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, SAVE_AT = 3, 6, 2


def _run(tmp_path: Path, *, off_by_one: bool, steps: int = STEPS,
         k_flag: int | None = K) -> list:
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(4, 5, generator=g) for _ in range(K * steps)]
    state: dict = {}

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 1)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def run(resume: bool) -> None:
        model, opt = build()
        step, micro = 0, 0
        if resume:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            step, micro = state["step"], state["micro"]
        for b in batches[step * K:]:
            (model(b).pow(2).mean() / K).backward()
            if (micro + 1) % K == 0:
                opt.step()
                opt.zero_grad()
                step += 1
                if step == SAVE_AT and not resume:
                    state.update(model=model.state_dict(), opt=opt.state_dict(), step=step,
                                 micro=micro if off_by_one else micro + 1)
                    return
            micro += 1

    with recording(tmp_path):
        run(resume=False)
        run(resume=True)
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=k_flag)
    return [f for f in findings if f.severity.value in ("error", "warning")]


def test_a_counter_restored_one_short_shifts_the_windows(tmp_path: Path) -> None:
    found = _run(tmp_path, off_by_one=True)
    assert [f.cls for f in found] == ["F13"], found
    assert found[0].severity.value == "error"
    assert "first window" in found[0].title and "held 1 of K" in found[0].evidence


@pytest.mark.parametrize("off_by_one", [False])
def test_the_counter_restored_at_the_boundary_is_silent(tmp_path: Path, off_by_one: bool) -> None:
    assert _run(tmp_path, off_by_one=off_by_one) == []


def test_a_shifted_resume_with_k_inferred_and_one_window_after_is_an_error(
        tmp_path: Path) -> None:
    """K not declared (inferred from the windows), and the resumed run makes one whole window
    after its short first one (blind round 59 a_b03): the windows before the rebuild were
    steadily K too, so the short first window is the counter's shift, an error."""
    found = _run(tmp_path, off_by_one=True, steps=4, k_flag=None)
    assert [(f.cls, f.severity.value) for f in found] == [("F13", "error")], found
