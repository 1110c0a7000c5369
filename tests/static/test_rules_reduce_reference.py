"""AG107 reads only the divisions that can reach the summed gradients: the training loop
around the all-reduce and what runs before it. Blind round 52 c_b01 sums gradients by hand,
never divides by W, and is silent when a single-process reference after the loop divides its
loss by a count of every rank's chunks, or when the data is sized ``* world``."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_SRC = """
import torch
import torch.distributed as dist


def main(model, data, ref, steps, accum):
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    xs = data(8 * accum * world * steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        for micro in range(accum):
            loss = model(xs[step, micro]).mean() / accum
            loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
{fix}
        opt.step()
        opt.zero_grad()
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(steps):
        chunks = [xs[step, m, r] for m in range(accum) for r in range(world)]
        total = sum(ref(c).sum() for c in chunks)
        (total / (8 * len(chunks))).backward()
        ropt.step()
"""


@pytest.mark.parametrize(("fix", "expected"), [
    ("", ["AG107"]),
    ("            p.grad.div_(world)", []),
    ("            p.grad.mul_(1.0 / world)", []),
])
def test_sum_reduce_read_against_the_training_loop_only(fix: str, expected: list[str]) -> None:
    src = _SRC.replace("{fix}\n", fix + "\n" if fix else "")
    found = [f.code for f in lint_source(textwrap.dedent(src)) if f.code == "AG107"]
    assert found == expected
