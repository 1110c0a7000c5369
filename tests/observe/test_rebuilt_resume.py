"""A run interrupted mid-window, then rebuilt to resume (a new model, a new optimizer) in the
same process: the abandoned model's backwards ran before the new optimizer existed, and its
parameters held no gradient when it was made, so they are not in its first window.

* The resume continues the half-finished window from the saved micro-batch with no saved
  gradient (blind round 35 c_b01): its first window is short, the next whole: F13 error.
* The resume rewinds the data to the window's start and replays it: silent.
* The resume continues mid-window and restores the gradient saved with the checkpoint
  (after making the optimizer): the large batch, silent.

Recorded in-process as ``watch`` records it, judged by the CLI's function."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from accumguard.watch import recording
from accumguard.watch._report import judge

K = 4
STEPS = 4
CRASH = 7  # micro-batches done when the first run stops (window 2 has 3 of 4)


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g))
            for _ in range(STEPS * K)]


def _run(out: Path | None, resume: str, failures: list[object] | None = None) -> torch.Tensor:
    """The final weights; ``out`` None: nothing records the run. ``failures`` gets the
    recorder's internal failure (None when there was none)."""
    data = _data()
    torch.manual_seed(0)
    init = torch.nn.Linear(8, 2).state_dict()
    saved: dict[str, object] = {}

    def train(micro: int, stop: int | None, restore: dict[str, torch.Tensor] | None
              ) -> torch.nn.Module:
        model = torch.nn.Linear(8, 2)
        model.load_state_dict(saved.get("model", init))  # type: ignore[arg-type]
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if "opt" in saved:
            opt.load_state_dict(saved["opt"])  # type: ignore[arg-type]
        if restore is not None:
            for name, p in model.named_parameters():
                p.grad = restore[name].clone()
        while micro < STEPS * K:
            x, y = data[micro]
            (F.mse_loss(model(x), y) / K).backward()
            micro += 1
            saved["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()
                              if p.grad is not None}
            saved["micro"] = micro
            if stop is not None and micro == stop:
                return model  # pre-empted: model and optimizer abandoned
            if micro % K == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
                saved["model"] = {k: v.clone() for k, v in model.state_dict().items()}
                saved["opt"] = opt.state_dict()
        return model

    with recording(out) if out is not None else contextlib.nullcontext() as obs:
        if obs is not None:
            obs.budget = None  # every window's loss recorded
        train(0, CRASH, None)
        at = int(saved["micro"])  # type: ignore[call-overload]
        if resume == "replay":
            model = train(at - at % K, None, None)
        elif resume == "restore":
            model = train(at, None, saved["grads"])  # type: ignore[arg-type]
        else:
            model = train(at, None, None)
    if obs is not None and failures is not None:
        failures.append(obs.failure)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_a_resume_mid_window_without_the_saved_gradient_is_f13(tmp_path: Path) -> None:
    _run(tmp_path / "bug", "mid")
    res = judge(tmp_path / "bug", accumulation_steps=K)
    assert [f.cls for f in res.errors] == ["F13"], [(f.cls, f.evidence) for f in res.findings]
    ev = res.errors[0].evidence
    assert "made after 3 backward pass(es) whose gradient it does not hold" in ev, ev
    assert "first step after 1 backward pass(es) of its own, the next after 4" in ev, ev
    assert "3 micro-batch(es) of that window are missing" in ev, ev


@pytest.mark.parametrize("resume", ["replay", "restore"])
def test_a_resume_that_replays_or_restores_the_window_is_silent(tmp_path: Path,
                                                                 resume: str) -> None:
    _run(tmp_path / resume, resume)
    res = judge(tmp_path / resume, accumulation_steps=K)
    assert not [f for f in res.findings if f.severity.value != "note"], \
        [(f.cls, f.evidence) for f in res.findings]


def test_watching_a_rebuilt_run_changes_nothing(tmp_path: Path) -> None:
    assert torch.equal(_run(None, "mid"), _run(tmp_path / "w", "mid"))



@pytest.mark.parametrize("where", ["without_first", "birth"])
def test_a_fault_in_the_resume_bookkeeping_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The rebuilt run's first window is cut inside the optimizer-step hook
    (``StepTally.without_first``) and the birth record is taken inside the wrapper of
    ``Optimizer.__init__`` (``Lanes.birth``): an internal error in either switches
    observation off, is recorded as accumguard's own failure, and the run trains with the
    same bits as unobserved."""
    from accumguard.observe._lanes import Lanes
    from accumguard.observe._window import StepTally

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"injected: {where}")

    plain = _run(None, "mid")
    monkeypatch.setattr(StepTally if where == "without_first" else Lanes, where, boom)
    failures: list[object] = []
    watched = _run(tmp_path / "w", "mid", failures)
    assert torch.equal(plain, watched)
    assert failures and failures[0] is not None, "the injected fault did not fire"
    assert f"injected: {where}" in str(failures[0]), failures[0]
