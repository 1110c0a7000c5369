"""A run limit that leaves the loop (`if it >= steps * K: break`) is not an accumulation
boundary: what follows it runs on every micro-step. A `continue` off the boundary (or a
`return` off it in a helper) still guards what follows."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_LOOP = """
import torch

GRAD_ACCUM = 4
STEPS = 6

def train_micro(model, batch, opt, sched, it, accum=GRAD_ACCUM):
    loss = model(batch).mean() / accum
    loss.backward()
    if (it + 1) % accum == 0:
        opt.step()
        opt.zero_grad()
    sched.step()

def run(model, loader, opt, sched):
    for it, batch in enumerate(loader):
        {stop}
        train_micro(model, batch, opt, sched, it)
"""

_SKIP = """
import torch

GRAD_ACCUM = 4

def run(model, loader, opt, sched):
    for it, batch in enumerate(loader):
        loss = model(batch).mean() / GRAD_ACCUM
        loss.backward()
        {stop}
        opt.step()
        opt.zero_grad()
        sched.step()
"""


def _codes(src: str) -> list[str]:
    return [f.code or "" for f in lint_source(textwrap.dedent(src))]


@pytest.mark.parametrize("stop", ["if it >= STEPS * GRAD_ACCUM:\n            break",
                                  "if it >= STEPS * GRAD_ACCUM:\n            return",
                                  "pass"])
def test_scheduler_after_a_run_limit_is_still_every_micro_batch(stop: str) -> None:
    assert "AG103" in _codes(_LOOP.format(stop=stop))


@pytest.mark.parametrize("stop", ["if (it + 1) % GRAD_ACCUM != 0:\n            continue"])
def test_a_continue_off_the_boundary_still_guards(stop: str) -> None:
    assert _codes(_SKIP.format(stop=stop)) == []
