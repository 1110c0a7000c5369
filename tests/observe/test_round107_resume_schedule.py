"""A scheduler rebuilt for a resume and fast-forwarded with ``sched.step()`` calls before its
optimizer's first step (blind round 107 b_b02: FSDP2, the saved micro-batch count used
instead of the optimizer steps; its twin, fast-forwarded by the optimizer steps, had a
false F4 error: "stepped 7 times when its optimizer had stepped 1 times"). The catch-up is
judged against the final count of the scheduler it replaced: equal is the resume, K x that
count is F4; with nothing to compare in the process, a note."""

from __future__ import annotations

from pathlib import Path

import torch

from accumguard.observe._catch_up import catch_up
from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording
from tests.helpers import judge_recorded

K, BEFORE, AFTER = 4, 3, 3


def _errors(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.severity == "error"]


def test_fsdp2_resume_fast_forwarded_by_micro_batches_is_f4() -> None:
    found = _errors(judge_recorded("r107_fsdp2_resume_schedule_fast_forward_by_micro_batches"))
    assert {f.cls for f in found} == {"F4"}, found
    assert "24 = K x 6" in found[0].evidence and "18 steps further on" in found[0].evidence


def test_fsdp2_resume_fast_forwarded_by_optimizer_steps_is_silent() -> None:
    assert _errors(judge_recorded("r107_fsdp2_resume_schedule_fast_forward_by_steps")) == []


def _loop(catch_up_by: int) -> list[torch.Tensor]:
    """BEFORE optimizer steps of K micro-steps, then the model, optimizer and scheduler
    rebuilt (the state carried over) and the new scheduler stepped ``catch_up_by`` times
    before AFTER more steps."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    g = torch.Generator().manual_seed(5)

    def build(state: dict | None) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        if state is not None:
            opt.load_state_dict(state)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))

    opt, sched = build(None)
    for phase in range(2):
        if phase:
            opt, sched = build(opt.state_dict())
            for _ in range(catch_up_by):
                sched.step()
        for _ in range(BEFORE if not phase else AFTER):
            for _ in range(K):
                (model(torch.randn(3, 4, generator=g)).pow(2).mean() / K).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
    return [p.detach().clone() for p in model.parameters()]


def _observed(tmp_path: Path, catch_up_by: int) -> list[Finding]:
    plain = _loop(catch_up_by)
    with recording(tmp_path):
        seen = _loop(catch_up_by)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.cls == "F4"]


def test_in_one_process_a_catch_up_by_the_steps_made_is_the_resume(tmp_path: Path) -> None:
    assert _errors(_observed(tmp_path, BEFORE)) == []


def test_in_one_process_a_catch_up_by_the_micro_batches_is_f4(tmp_path: Path) -> None:
    found = _errors(_observed(tmp_path, K * BEFORE))
    assert [f.cls for f in found] == ["F4"], found
    assert f"{K * BEFORE} = K x {BEFORE}" in found[0].evidence


def test_a_catch_up_with_nothing_to_compare_is_a_note() -> None:
    """A fresh process resuming: no earlier scheduler, so the catch-up is not judged."""
    events = [{"sid": 1, "step": 0, "count": c, "optimizer_steps": 0, "micro": 0,
               "in_step": False, "fresh": True} for c in range(1, 7)]
    events += [{"sid": 1, "step": s, "count": 6 + s, "optimizer_steps": s, "micro": 0,
                "in_step": False} for s in range(1, 4)]
    offsets, found = catch_up(0, events, None)
    assert offsets == {1: 6}
    assert [(f.cls, f.severity) for f in found] == [("F4", "note")], found
