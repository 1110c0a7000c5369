"""AG131 under ``GradientAccumulationScheduler``: K changes per epoch, and an epoch whose
batches are not a multiple of its K ends in a short window still divided by that K. The
schedule is read as a literal, a name or a config entry; the loader's length through a data
helper returning a tuple. Twins: a schedule that divides the epoch, a module that rescales
its short window from ``self.trainer.accumulate_grad_batches``."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_SCRIPT = """
import torch
import pytorch_lightning as pl
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from torch.utils.data import DataLoader, TensorDataset

HP = dict(rows=36, bs=4, schedule={{0: 2, 1: 4}}, epochs=2)
SCHEDULE = {schedule_literal}


def make_data():
    x = torch.randn(HP["rows"], 10)
    y = torch.randn(HP["rows"], 1)
    return x, y


class Net(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
{rescale}        return loss


def main():
    feats, targets = make_data()
    loader = DataLoader(TensorDataset(feats, targets), batch_size=HP["bs"])
    trainer = pl.Trainer(max_epochs=HP["epochs"],
                         callbacks=[GradientAccumulationScheduler(scheduling={schedule})])
    trainer.fit(Net(), loader)
"""

_RESCALE = """        k = self.trainer.accumulate_grad_batches
        tail = self.trainer.num_training_batches % k
        if tail and batch_idx >= self.trainer.num_training_batches - tail:
            loss = loss * k / tail
"""


def _ag131(schedule: str, literal: str = "{0: 2, 1: 4}", rescale: str = "") -> list[tuple[str, str]]:
    src = textwrap.dedent(_SCRIPT.format(schedule=schedule, schedule_literal=literal, rescale=rescale))
    return [(f.severity.value, f.message) for f in lint_source(src) if f.code == "AG131"]


@pytest.mark.parametrize("schedule", ['{0: 2, 1: 4}', 'HP["schedule"]', "SCHEDULE"])
def test_a_scheduled_k_that_leaves_a_tail(schedule: str) -> None:
    found = _ag131(schedule)
    assert len(found) == 1, found
    level, message = found[0]
    assert level == "error"
    assert "9 batches" in message
    assert "epoch 0: K = 2, a last window of 1" in message
    assert "epoch 1: K = 4, a last window of 1" in message


def test_only_the_epochs_the_run_makes() -> None:
    # epoch 2's K = 4 never runs with max_epochs=2; epoch 1's K = 3 divides 9
    assert _ag131("{0: 1, 1: 3, 2: 4}") == []


def test_a_module_that_rescales_its_short_window_is_silent() -> None:
    assert _ag131("{0: 2, 1: 4}", rescale=_RESCALE) == []


def test_the_data_helper_s_names_are_read_in_its_own_scope() -> None:
    # blind round 49 c_b01: `x` of the data helper is also a slice in the reference below;
    # the rows the loader sees are the helper's (106 rows / 16 = 7 batches, K = 3)
    src = textwrap.dedent("""
        import torch
        import pytorch_lightning as pl
        from torch.utils.data import DataLoader, TensorDataset

        CFG = dict(n_rows=106, bs=16, k=3)


        def make_dataset():
            x = torch.randn(CFG["n_rows"], 12)
            y = torch.randn(CFG["n_rows"], 1)
            return TensorDataset(x, y)


        def main():
            ds = make_dataset()
            trainer = pl.Trainer(max_epochs=2, accumulate_grad_batches=CFG["k"])
            trainer.fit(Net(), DataLoader(ds, batch_size=CFG["bs"]))
            x_all, y_all = ds.tensors
            for s in range(0, CFG["n_rows"], 48):
                x = x_all[s:s + 48]
                model(x).sum().backward()
    """)
    found = [f for f in lint_source(src) if f.code == "AG131"]
    assert len(found) == 1 and "7 batches" in found[0].message, found
