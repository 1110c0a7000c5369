"""AG141 in timm's shape of ``train_one_epoch``: the end of the pass reaches the step through
two names (``last_batch = batch_idx == last_batch_idx`` with ``last_batch_idx = len(loader) -
1``, then ``need_update = last_batch or (batch_idx + 1) % accum_steps == 0``), and the fix
rebinds the divisor in the tail (``if batch_idx >= last_batch_idx_to_accum: accum_steps =
last_accum_steps``), which makes the division no constant K."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_LOOP = """
def train_one_epoch(model, loader, optimizer, loss_fn, args):
    accum_steps = args.grad_accum_steps
    last_accum_steps = len(loader) % accum_steps
    last_batch_idx = len(loader) - 1
    last_batch_idx_to_accum = len(loader) - last_accum_steps
    optimizer.zero_grad()
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
{fix}
        loss = loss_fn(model(input), target)
        if accum_steps > 1:
            loss /= accum_steps
        loss.backward()
        if need_update:
            optimizer.step()
            optimizer.zero_grad()
"""

_FIX = """        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps
"""


def _codes(src: str) -> list[str]:
    return [f.code for f in lint_source(textwrap.dedent(src)) if f.code == "AG141"]


def test_the_tail_divided_by_k_through_two_names() -> None:
    found = [f for f in lint_source(_LOOP.format(fix="")) if f.code == "AG141"]
    assert len(found) == 1, found
    assert "last_batch or (batch_idx + 1) % accum_steps == 0" in found[0].message


@pytest.mark.parametrize("fix", [
    _FIX,
    # the same fix written as a conditional rebinding on the flag
    "        if last_batch and last_accum_steps:\n            accum_steps = last_accum_steps\n",
])
def test_the_tail_divisor_rebound_in_the_loop_is_silent(fix: str) -> None:
    assert _codes(_LOOP.format(fix=fix)) == []


def test_a_name_bound_twice_is_not_read_as_the_end_of_the_pass() -> None:
    src = _LOOP.format(fix="").replace(
        "        last_batch = batch_idx == last_batch_idx\n",
        "        last_batch = batch_idx == last_batch_idx\n        last_batch = False\n")
    assert _codes(src) == []
