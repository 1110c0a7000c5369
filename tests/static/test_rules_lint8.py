"""Statically decidable classes lint used to miss, in several spellings each, against their
correct twins: the scheduler stepped on every micro-batch inside the backward helper the loop
calls (AG103)."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source


def found(src: str) -> list[tuple[str, int, str]]:
    return [(f.code or "", f.line or 0, f.severity.value) for f in lint_source(textwrap.dedent(src))]


# ---------------------------------------------------------------- 1. F4 in a backward helper

_SCHED_FUNC = """
import torch

def train_one(model, batch, opt, sched, it, k=4):
    loss = model(batch).mean() / k
    loss.backward()
    if (it + 1) % k == 0:
        opt.step()
        opt.zero_grad()
        {in_branch}
    {after}

def run(model, loader, opt, sched):
    for it, batch in enumerate(loader):
        train_one(model, batch, opt, sched, it)
"""

_SCHED_METHOD = """
import torch

class Runner:
    def __init__(self, model, loader, k):
        self.model, self.loader, self.k = model, loader, k
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)

    def one(self, batch, it):
        (self.model(batch).mean() / self.k).backward()
        if (it + 1) % self.k == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
            {in_branch}
        {after}

    def fit(self):
        for it, batch in enumerate(self.loader):
            self.one(batch, it)
"""

_SCHED_SCALER = """
import torch
from transformers import get_linear_schedule_with_warmup

def step_fn(model, batch, optimizer, scheduler, scaler, step, k):
    with torch.autocast("cuda"):
        loss = model(batch).loss / k
    scaler.scale(loss).backward()
    if step % k == k - 1:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        {in_branch}
    {after}

def main(model, loader):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = get_linear_schedule_with_warmup(optimizer, 100, 1000)
    scaler = torch.cuda.amp.GradScaler()
    step = 0
    for batch in loader:
        step_fn(model, batch, optimizer, scheduler, scaler, step, 4)
        step += 1
"""

_SCHED_CASES = [(_SCHED_FUNC, "sched.step()", 11), (_SCHED_METHOD, "self.lr_scheduler.step()", 16),
                (_SCHED_SCALER, "scheduler.step()", 14)]


@pytest.mark.parametrize(("template", "call", "line"), _SCHED_CASES)
def test_scheduler_stepped_per_micro_batch_in_helper_is_f4(template: str, call: str, line: int) -> None:
    assert found(template.format(in_branch="pass", after=call)) == [("AG103", line, "error")]


@pytest.mark.parametrize(("template", "call", "line"), _SCHED_CASES)
def test_scheduler_stepped_at_the_helpers_boundary_is_silent(template: str, call: str, line: int) -> None:
    assert found(template.format(in_branch=call, after="pass")) == []
