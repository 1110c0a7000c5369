"""A scheduler given its position (blind round 96 c_c02): ``CosineAnnealingWarmRestarts.
step(epoch + i / iters)`` on every micro-batch, torch's documented use, is legal: the rate
at each optimizer step is the large batch's. watch counted those calls as scheduler steps
and said F4 at error ("stepped 2 times when its optimizer had stepped 0 times"). Calls given
a position are now counted apart (``scheduler_positioned``): at most the hand-schedule
warning that states both readings (on the run's recording, 2 gloo ranks, five steps)."""

from __future__ import annotations

import torch

from tests.helpers import judge_recorded


def test_fractional_epoch_steps_are_no_error() -> None:
    findings = judge_recorded("r96_warm_restarts_fractional_epoch")
    assert not [f for f in findings if f.severity == "error"], findings
    warned = [f for f in findings if f.cls == "F4"]
    assert all("scheduler.step(position)" in f.title for f in warned), warned


def test_the_observer_counts_positioned_calls_apart(tmp_path: object) -> None:
    """In process: three windows of K = 2, the scheduler placed on every micro-batch, and
    a StepLR stepped once per window: only the latter counts as scheduler steps."""
    from pathlib import Path

    from accumguard.watch._findings import load_recordings
    from accumguard.watch._recording import recording

    assert isinstance(tmp_path, Path)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    warm = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2)
    with recording(tmp_path):
        for step in range(3):
            for i in range(2):
                (model(torch.randn(4, 3)).sum() / 2).backward()
                warm.step(step + i / 2)
            opt.step()
            opt.zero_grad()
    rec = load_recordings(tmp_path)
    steps = rec.steps[0]
    assert [s["scheduler_steps"] for s in steps] == [0, 0, 0]
    assert sum(s["scheduler_positioned"] for s in steps) == 6


def _placed_loop() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    warm = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        for i in range(2):
            (model(torch.randn(4, 3, generator=g)).sum() / 2).backward()
            warm.step(step + i / 2)
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_a_fault_counting_a_positioned_step_changes_nothing(
        tmp_path: object, monkeypatch: object) -> None:
    """The count of a scheduler step given its position runs inside the user's
    ``scheduler.step``: a fault there switches observation off, is reported as accumguard's,
    and the trained weights are bit-equal to the unobserved run's."""
    from pathlib import Path

    import pytest

    from accumguard.observe._observer import Observer
    from accumguard.watch._recording import recording

    assert isinstance(tmp_path, Path) and isinstance(monkeypatch, pytest.MonkeyPatch)
    plain = _placed_loop()
    original = Observer._count_sched

    def broken(self: Observer, sched: object, positioned: bool = False) -> None:
        if positioned:
            raise RuntimeError("injected: a positioned scheduler step")
        original(self, sched, positioned)

    monkeypatch.setattr(Observer, "_count_sched", broken)
    with recording(tmp_path) as obs:
        seen = _placed_loop()
        failure = obs.failure
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
