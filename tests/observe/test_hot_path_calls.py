"""The per-step Python work of watch, the guard and the callbacks stays below what it was
before the judge/observer redesign (b56c5f4), counted rather than timed.

Python calls per optimizer step of the demo LM (K = 4), the least step after a warm-up
(the per-event work: listeners, doors, bookkeeping; not the conservation checksums or loss
records sampled on a time budget), added to the plain loop. Measured with
``benchmarks/bench_calls.py`` (the same count): b56c5f4 300 / 207 / 127 (watch / guard /
callbacks), 8a7185e 311 / 222 / 138, after the hot-path work 237 / 171 / 109. The bounds
below leave a few calls of slack; a change that adds per-event work fails here: measure
its cost (``python benchmarks/bench_calls.py``) before raising a bound.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from types import FrameType

import pytest
import torch

from accumguard.demo.toy import TinyCausalLM, count_tokens, make_lm_batches, token_loss

K = 4
BOUNDS = {"watch": 250, "guard": 180, "callbacks": 115}


class _Loop:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = TinyCausalLM()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0)
        self.data = make_lm_batches(seed=0, world_size=1, micro_batches=K * 4,
                                    micro_batch_size=4, seq_len=32)[0]
        self.s = 0

    def step(self) -> None:
        w = self.s % (len(self.data) // K)
        self.s += 1
        batches = self.data[w * K:(w + 1) * K]
        n = sum(float(count_tokens(b)) for b in batches)
        for b in batches:
            (token_loss(self.model, b)[0] / n).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad()


def _calls(fn: object) -> int:
    count = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        fn()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return count


@contextlib.contextmanager
def _installed(tool: str, loop: _Loop) -> Iterator[None]:
    if tool == "watch":
        from accumguard.watch import recording

        with tempfile.TemporaryDirectory() as tmp, recording(tmp):
            yield
    elif tool == "guard":
        from accumguard.runtime.guard import guard

        g = guard(loop.model, loop.opt, accumulation_steps=K, scheduler=loop.sched).install()
        try:
            yield
        finally:
            g.close()
    else:
        from accumguard.integrations._checks import AccumulationChecks

        checks = AccumulationChecks(loop.model, loop.opt, accumulation_steps=K,
                                    scheduler=loop.sched, logits_module=loop.model.head,
                                    every_n_steps=10)
        try:
            yield
        finally:
            checks.close()


@pytest.mark.parametrize("tool", list(BOUNDS))
def test_per_step_calls_stay_below_the_pre_redesign_level(tool: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # the work sampled on a time budget (conservation checksums, loss records) is not the
    # per-event work counted here; on a loaded machine a slow install leaves a budget large
    # enough to sample every measured step, so the budgets are nil after the warm-up steps
    # (the first windows are checked whatever the budget)
    import accumguard.observe._losses as losses
    import accumguard.observe._profiles as profiles

    monkeypatch.setattr(profiles, "WATCH_BUDGET", 0.0)
    monkeypatch.setattr(profiles, "CONSERVATION_BUDGET", 0.0)
    monkeypatch.setattr(losses, "_BUDGET", 0.0)
    loop = _Loop()
    for _ in range(3):
        loop.step()
    plain = min(_calls(loop.step) for _ in range(4))
    with _installed(tool, loop):
        for _ in range(4):  # the first windows' conservation is always checked
            loop.step()
        tooled = min(_calls(loop.step) for _ in range(8))
    added = tooled - plain
    assert added <= BOUNDS[tool], (
        f"{tool} adds {added} Python calls per step of the demo LM (bound {BOUNDS[tool]})")
