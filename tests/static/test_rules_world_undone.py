"""AG112 stays silent when the division by a count over all ranks is multiplied back by the
world size in the same expression (blind round 52 a_c02: a DPO loss ``losses.sum() /
global_pairs * world`` with ``global_pairs = world * K * micro_pairs``, undoing DDP's mean on
purpose); without the factor it is the division by W DDP repeats."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_SRC = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(policy, windows, world, accum, micro_pairs):
    ddp = DDP(policy)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    global_pairs = world * accum * micro_pairs
    for micro in windows:
        for k, rows in enumerate(micro):
            ctx = ddp.no_sync() if k < len(micro) - 1 else torch.enable_grad()
            with ctx:
                losses = pair_losses(ddp, rows)
                loss = {loss}
                loss.backward()
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize(("loss", "expected"), [
    ("losses.sum() / global_pairs * world", []),
    ("losses.sum() / global_pairs", ["AG112"]),
])
def test_a_division_by_the_global_count_multiplied_back(loss: str, expected: list[str]) -> None:
    found = [f.code for f in lint_source(textwrap.dedent(_SRC.format(loss=loss)))
             if f.code == "AG112"]
    assert found == expected
