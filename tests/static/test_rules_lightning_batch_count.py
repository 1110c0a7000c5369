"""AG104 under Lightning: ``training_step`` returns a sum divided by a count read from its
own ``batch`` (``nll.sum() / batch["mask"].sum()``), one micro-batch's token count, while
Lightning divides by ``accumulate_grad_batches`` (blind round 51, c_b02). The twins divide by
the window's count carried in the batch, or accumulate nothing."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_SRC = """
import pytorch_lightning as pl


class Lit(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        nll = token_nll(self.net, batch)
        loss = {loss}
        return loss


trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches={k})
"""


@pytest.mark.parametrize(("loss", "k", "expected"), [
    ('nll.sum() / batch["mask"].sum()', 4, ["AG104"]),
    ('nll.sum() / batch["window_tokens"] * self.trainer.accumulate_grad_batches', 4, []),
    ('nll.sum() / batch["mask"].sum()', 1, []),
])
def test_a_mean_over_the_step_s_own_batch(loss: str, k: int, expected: list[str]) -> None:
    found = [f.code for f in lint_source(textwrap.dedent(_SRC.format(loss=loss, k=k)))
             if f.code == "AG104"]
    assert found == expected
