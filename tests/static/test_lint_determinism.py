"""The lint's findings do not depend on where Python happens to allocate the syntax tree:
a choice among several candidates follows the source order, never a set's order."""

from __future__ import annotations

import re

from accumguard.static.lint import lint_source

_LOOP = """
for i in range(num_steps * accum_steps):
    x, y = next(batches)
    (torch.nn.functional.mse_loss(net(x), y) / accum_steps).backward()
    if (i + 1) % accum_steps == 0:
        for g in opt.param_groups:
            g["lr"] = lr_at(i)
        opt.step()
        opt.zero_grad()
"""

_SCRIPT = """import torch

accum_steps = 4
num_steps = 1000
warmup = 100


def lr_at(step, base=3e-4):
    return base * min(1.0, step / warmup)

""" + _LOOP + _LOOP


def test_lr_counter_window_is_the_first_in_source_order() -> None:
    """Two module-level flat windows counted by the same ``i`` (a concatenated script): the
    AG130 message names the first window, on every parse. Chosen from a set of tree nodes,
    it followed the nodes' addresses and changed from run to run."""
    first_loop = _SCRIPT.splitlines().index("for i in range(num_steps * accum_steps):") + 1
    seen: set[tuple[int, ...]] = set()
    for _ in range(40):
        findings = [f for f in lint_source(_SCRIPT) if f.code == "AG130"]
        assert len(findings) == 2
        seen.add(tuple(int(m) for f in findings for m in re.findall(r"window at line (\d+)", f.message)))
        _ = [object() for _ in range(1000)]  # move the next tree's allocation around
    assert seen == {(first_loop, first_loop)}
