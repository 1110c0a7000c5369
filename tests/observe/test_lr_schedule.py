"""F4 for a learning-rate schedule written by hand into ``param_groups`` (nanoGPT's
``get_lr(it)``): traced in-process by the observer at every backward, judged on the step
records. Moving between the backwards of a window, it is an error when the run shows the
schedule ending K x early (its lengths count optimizer steps), else a warning saying both
readings (a schedule counting data consumed, minGPT's tokens, gives each step the large
batch's rate); indexed by the optimizer step, or driven by a scheduler, silent."""

from __future__ import annotations

import math
from typing import Any

import torch

from accumguard.observe import Observer
from accumguard.observe._lr_rules import lr_schedule_findings
from accumguard.observe._records import _windows


class _Steps:
    """A listener keeping the step records as the recording stores them."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def on_step(self, ev: Any) -> None:
        self.steps.append({"step": ev.step, "backwards": ev.backwards, "applied": ev.applied,
                           "lr_changes": ev.lr_changes, "lr": ev.lr,
                           "scheduler_steps": ev.scheduler_steps})


def _cosine(it: int, horizon: int, warmup: int = 2) -> float:
    if it < warmup:
        return 1e-3 * (it + 1) / warmup
    r = min(1.0, (it - warmup) / max(1, horizon - warmup))
    return 1e-4 + 0.5 * (1 + math.cos(math.pi * r)) * (1e-3 - 1e-4)


def _run(*, steps: int, k: int, per_micro: bool, horizon: int, scheduler: bool = False
         ) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=horizon) if scheduler else None
    obs = Observer(roots=[model])
    rec = _Steps()
    obs.add_listener(rec)
    g = torch.Generator().manual_seed(1)
    with obs:
        it = 0
        for step in range(steps):
            if not per_micro and sched is None:
                for grp in opt.param_groups:
                    grp["lr"] = _cosine(step, horizon)
            for _ in range(k):
                if per_micro:
                    for grp in opt.param_groups:
                        grp["lr"] = _cosine(it, horizon)
                (model(torch.randn(3, 4, generator=g)).pow(2).mean() / k).backward()
                it += 1
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
    return rec.steps


def _sev(found: list[Any]) -> set[tuple[str, str]]:
    return {(f.cls, f.severity) for f in found}


def test_per_micro_step_schedule_with_a_horizon_in_optimizer_steps_is_an_error() -> None:
    steps = _run(steps=12, k=4, per_micro=True, horizon=12)
    assert all(s["lr_changes"] is not None for s in steps)
    found = lr_schedule_findings(0, _windows(steps), 4)
    assert _sev(found) == {("F4", "error")}, found
    assert "reached its end 4 x early" in found[0].evidence
    assert "get_lr(iter_num)" in found[0].fix


def test_per_micro_step_schedule_still_moving_is_a_warning() -> None:
    # the run stops before the schedule's end: a counter of micro-steps (wrong) and a count
    # of tokens consumed (minGPT, right: the large batch consumes the same tokens per step)
    # move the rate alike, so which one is not seen (blind round 85 c_b02_fixed was the latter)
    found = lr_schedule_findings(0, _windows(_run(steps=6, k=4, per_micro=True, horizon=200)), 4)
    assert _sev(found) == {("F4", "warning")}, found
    ev = found[0].evidence
    assert "advances 4 x per step" in ev and "counts data consumed" in ev, ev
    assert "which one is not seen" in ev and "indexed by the micro-step" not in ev, ev


def test_step_indexed_and_scheduler_driven_schedules_are_silent() -> None:
    for steps in (_run(steps=12, k=4, per_micro=False, horizon=12),
                  _run(steps=12, k=4, per_micro=False, horizon=12, scheduler=True),
                  _run(steps=12, k=1, per_micro=True, horizon=12)):
        assert lr_schedule_findings(0, _windows(steps), 4) == [], steps


def test_a_micro_step_horizon_ending_with_the_run_is_still_per_micro_step() -> None:
    # indexed by micro-steps and counted in micro-steps: the schedule ends with the run; a
    # counter of micro-steps gives each update the rate K micro-steps on (wrong), a count of
    # tokens consumed the large batch's (right): a warning
    found = lr_schedule_findings(0, _windows(_run(steps=8, k=4, per_micro=True, horizon=30)),
                                 4)
    assert _sev(found) == {("F4", "warning")}, found  # (a token count would move alike)
    assert "reached its end" not in found[0].evidence


def test_one_change_inside_a_window_is_not_a_per_micro_schedule() -> None:
    rows = [{"step": i, "backwards": 4, "applied": True, "lr_changes": 1 if i in (2, 5) else 0,
             "lr": 1e-3 if i < 5 else 5e-4} for i in range(10)]
    assert lr_schedule_findings(0, _windows(rows), 4) == []


def test_a_schedule_ending_inside_the_first_window_is_traced_from_the_optimizer_made() -> None:
    """blind 55 c_b01: warm-up and decay over 3 micro-steps, K = 4: the rate moves twice in
    the first window and never again. The optimizer made under observation is traced from
    its first backward; two changes inside one window are a per-micro-step schedule."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    obs = Observer(roots=[model])
    rec = _Steps()
    obs.add_listener(rec)
    g = torch.Generator().manual_seed(1)
    with obs:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # made under observation
        it = 0
        for _ in range(6):
            for _ in range(4):
                for grp in opt.param_groups:
                    grp["lr"] = _cosine(it, horizon=3, warmup=1)
                (model(torch.randn(3, 4, generator=g)).pow(2).mean() / 4).backward()
                it += 1
            opt.step()
            opt.zero_grad()
    assert rec.steps[0]["lr_changes"] == 2, rec.steps[0]
    found = lr_schedule_findings(0, _windows(rec.steps), 4)
    assert _sev(found) == {("F4", "error")}, found
    assert "more than once" in found[0].evidence


def test_a_scheduler_object_moving_the_rate_inside_windows_is_left_to_the_scheduler_rule() -> None:
    """A LR scheduler stepped on every micro-step also moves the rate between backwards; its
    F4 is the scheduler rule's (:mod:`._schedules`), not this one's ("no scheduler")."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    obs = Observer(roots=[model])
    rec = _Steps()
    obs.add_listener(rec)
    g = torch.Generator().manual_seed(1)
    with obs:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
        for _ in range(5):
            for _ in range(4):
                (model(torch.randn(3, 4, generator=g)).pow(2).mean() / 4).backward()
                sched.step()
            opt.step()
            opt.zero_grad()
    assert any(s["lr_changes"] for s in rec.steps), rec.steps
    assert lr_schedule_findings(0, _windows(rec.steps), 4) == []


def test_a_warm_up_peaking_inside_the_first_window_then_a_per_micro_decay() -> None:
    """blind 67 c_b03: the rate written from ``epoch * len(loader) + i`` (the micro-batch
    index), a warm-up of 2 over windows of 3: the first window moves once (0.1 -> 0.2, then
    the peak), the next ones at every backward until the floor. A partial move before the
    first window that moved at every backward is the warm-up's end, as one after the last
    is the decay's."""
    def lr_at(it: int) -> float:
        if it < 2:
            return 0.2 * (it + 1) / 2
        return 0.2 * max(0.05, 1.0 - (it - 2) / 6)

    rows = []
    it = 0
    for step in range(8):
        seen = [lr_at(it + m) for m in range(3)]
        it += 3
        changes = sum(1 for a, b in zip(seen, seen[1:], strict=False) if a != b)
        rows.append({"step": step, "backwards": 3, "applied": True, "lr_changes": changes,
                     "lr": seen[-1], "scheduler_steps": 0})
    assert [r["lr_changes"] for r in rows[:3]] == [1, 2, 2], rows
    found = lr_schedule_findings(0, _windows(rows), 3)
    assert _sev(found) == {("F4", "error")}, found
    assert "e.g. 2 change(s) among the 3" in found[0].evidence, found[0].evidence


def _closure_run(*, k: int, write_in_closure: bool, steps: int = 8) -> list[dict[str, Any]]:
    """Lightning's automatic optimisation by hand: the window's last micro-step runs in the
    closure given to ``optimizer.step``; the warm-up is written before the step (an
    ``optimizer_step`` override: once per step) or inside the closure before each of its
    backwards (per micro-step)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    obs = Observer(roots=[model])
    rec = _Steps()
    obs.add_listener(rec)
    g = torch.Generator().manual_seed(1)
    it = [0]

    def micro() -> torch.Tensor:
        if write_in_closure:
            for grp in opt.param_groups:
                grp["lr"] = _cosine(it[0], 4 * steps * k)
        it[0] += 1
        loss = model(torch.randn(3, 4, generator=g)).pow(2).mean() / k
        loss.backward()
        return loss

    with obs:
        for step in range(steps):
            for _ in range(k - 1):
                micro()
            if not write_in_closure:
                for grp in opt.param_groups:
                    grp["lr"] = _cosine(step, 4 * steps)
            opt.step(closure=micro)
            opt.zero_grad()
    return rec.steps


def test_a_rate_written_before_a_step_whose_closure_runs_a_backward_is_the_steps() -> None:
    """Blind round 106 c_b01_fixed: a warm-up written in a LightningModule's
    ``optimizer_step`` before ``optimizer.step(closure)`` changed the rate between the
    window's first backward and the closure's: once per step, not per micro-step."""
    assert lr_schedule_findings(None, _windows(_closure_run(k=2, write_in_closure=False)),
                                2) == []


def test_a_rate_written_inside_the_closure_before_its_backward_still_counts() -> None:
    found = lr_schedule_findings(None, _windows(_closure_run(k=3, write_in_closure=True)), 3)
    assert ("F4", "warning") in _sev(found) or ("F4", "error") in _sev(found), found


def test_a_warm_up_peak_held_for_one_backward_is_still_per_micro_step() -> None:
    """Blind round 108 a_b03 (recorded): a hand-written data-parallel trainer's hook sets a
    warm-up + cosine rate after every micro-batch; at the warm-up's peak the rate equals the
    decay's first value, so one window moved only once among its three backwards. The
    schedule reached its floor after about a third of the run: F4. The twin (the hook only
    at a window's end) is silent."""
    from tests.helpers import judge_recorded

    bad = [f for f in judge_recorded("r108_hand_lr_warmup_peak_per_micro_step")
           if f.severity == "error"]
    assert {f.cls for f in bad} == {"F4"}, bad
    assert "3 x early" in bad[0].evidence
    ok = judge_recorded("r108_hand_lr_per_optimizer_step")
    assert [f for f in ok if f.cls == "F4"] == [], ok
