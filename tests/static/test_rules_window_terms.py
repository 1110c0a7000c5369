"""AG127 with no term divided by K: one term normalised by the window's count (counted
before the micro-batches), another a mean over one micro-batch's own count (blind round 52
a_b01: an MoE z-loss ``(z * m).sum() / m.sum()`` beside ``ce_sum / n_tok * world``). Over K
micro-batches the second weighs K times its coefficient; normalised by the same window count,
or divided by K, it is right."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_SRC = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, batches, steps, accum, world, coef):
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for step in range(steps):
        window = batches[step * accum:(step + 1) * accum]
        n_tok = torch.tensor(float(sum((y != -100).sum() for _, y in window)))
        dist.all_reduce(n_tok)
        for k, (x, y) in enumerate(window):
            with (ddp.no_sync() if k < accum - 1 else torch.enable_grad()):
                ce_sum, z, m = terms(ddp, x, y)
                z_loss = {z_loss}
                loss = ce_sum / n_tok * world + coef * z_loss
                loss.backward()
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize(("z_loss", "expected"), [
    ("(z * m).sum() / m.sum()", ["AG127"]),
    ("(z * m).sum() / n_tok * world", []),
    ("(z * m).sum() / m.sum() / accum", []),
])
def test_micro_batch_mean_beside_a_window_normalised_term(z_loss: str, expected: list[str]) -> None:
    found = [f.code for f in lint_source(textwrap.dedent(_SRC.replace("{z_loss}", z_loss)))
             if f.code == "AG127"]
    assert found == expected
