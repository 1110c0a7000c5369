"""A large-batch reference after the training (blind round 52, c_b01): its optimizer comes
from a factory of the file (``ropt = make_opt(ref)``, one return) and its loss is divided by
``MICRO_BS * len(chunks)``, the size of a micro-batch times the window's count. The factory's
optimizer is an optimizer, and ``MICRO_BS`` (a micro-batch's size) is no accumulation count:
the reference loop, stepping once per whole window, is no accumulating window (before: AG102
"zero_grad on every micro-batch" on it, an error on a correct script)."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_SRC = """
import torch

MICRO_BS, ACCUM, STEPS = 8, 4, 3


def make_opt(m):
    return torch.optim.SGD(m.parameters(), lr=0.1)


def reference(ref, data):
    ropt = make_opt(ref)
    for step in range(STEPS):
        chunks = [data[step][m] for m in range(ACCUM)]
        total = sum(loss_of(ref, c) * MICRO_BS for c in chunks)
        (total / ({size} * len(chunks))).backward()
        ropt.step()
        ropt.zero_grad(set_to_none=True)
"""


@pytest.mark.parametrize("size", ["MICRO_BS", "micro_batch_size"])
def test_a_reference_with_a_factory_optimizer_is_silent(size: str) -> None:
    src = _SRC.format(size=size).replace("MICRO_BS, ACCUM", f"{size}, ACCUM").replace(
        "* MICRO_BS for", f"* {size} for")
    assert [f.code for f in lint_source(textwrap.dedent(src))] == []


def test_a_factory_optimizer_stepped_inside_an_accumulating_loop_is_still_ag101() -> None:
    src = textwrap.dedent("""
        import torch

        def make_opt(m):
            return torch.optim.SGD(m.parameters(), lr=0.1)

        def train(model, batches, grad_accum):
            o = make_opt(model)
            for i, b in enumerate(batches):
                (model(b).mean() / grad_accum).backward()
                o.step()
                o.zero_grad()
    """)
    assert "AG101" in [f.code for f in lint_source(src)]
