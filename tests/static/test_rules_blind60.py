"""Shapes from blind rounds 59-60 (lint):

- an FSDP2 divide factor on the root only is an error without clipping and a warning with a
  norm clip in the file (clipping that acts rescales the averaged and the summed gradient
  to the same norm: only the gradient is proven off; 60 b_c02);
- a reference loop dividing its loss by a count of its window's data (a slice sized K x W)
  is a whole-window iteration: no F1 for its once-per-iteration step (60 b_c01)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source

_FSDP = """
import torch
from torch.distributed.fsdp import fully_shard

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
model.set_gradient_divide_factor(1.0)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    for k in range(4):
        model.set_requires_gradient_sync(k == 3)
        (loss_sum(model, k) / window_total).backward()
    CLIP
    opt.step()
    opt.zero_grad()
"""


def _severity(src: str, code: str) -> list[str]:
    return [f.severity.value for f in lint_source(textwrap.dedent(src)) if f.code == code]


def test_fsdp2_factor_on_the_root_is_an_error_without_clipping() -> None:
    assert _severity(_FSDP.replace("CLIP", "pass"), "AG156") == ["error"]


def test_fsdp2_factor_on_the_root_is_a_warning_with_a_norm_clip() -> None:
    clip = "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)"
    assert _severity(_FSDP.replace("CLIP", clip), "AG156") == ["warning"]


def test_a_reference_loop_over_window_slices_is_not_micro_steps() -> None:
    src = """
    import torch
    import torch.distributed as dist


    def main(cfg):
        rank = dist.get_rank()
        model = build()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
        for step in range(cfg.steps):
            n_window = window_tokens(step)
            for k in range(cfg.accum):
                ddp.require_backward_grad_sync = k == cfg.accum - 1
                sl = micro_slice(cfg, step, k, rank)
                loss = loss_sum_rows(ddp, ids[sl], labels[sl]) * cfg.world / n_window
                loss.backward()
            opt.step()
            opt.zero_grad()
        if rank == 0:
            ref = build()
            ropt = torch.optim.Adam(ref.parameters(), lr=cfg.lr)
            for step in range(cfg.steps):
                sl = slice(step * cfg.accum * cfg.world * cfg.micro_bs,
                           (step + 1) * cfg.accum * cfg.world * cfg.micro_bs)
                n = (labels[sl] != -100).sum()
                loss = loss_sum_rows(ref, ids[sl], labels[sl]) / n
                ropt.zero_grad()
                loss.backward()
                ropt.step()
    """
    found = [(f.code, f.severity.value) for f in lint_source(textwrap.dedent(src))]
    assert not [c for c, s in found if c in ("AG101", "AG104")], found


_LIGHTNING_OWN_DATASET = """
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset


class Blobs(Dataset):
    def __init__(self, n, din, classes=5):
        g = torch.Generator().manual_seed(0)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.x = torch.randn(n, din, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class DM(pl.LightningDataModule):
    def __init__(self, bs):
        super().__init__()
        self.bs = bs

    def setup(self, stage=None):
        self.ds = Blobs(ROWS, 8)

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=self.bs)


def main():
    model = Clf()
    trainer = pl.Trainer(accelerator="cpu", devices=2, max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(model, DM(6))
"""


def test_lightning_epoch_length_through_a_dataset_class_of_the_file() -> None:
    # 60 rows over 2 processes: 30 each, 5 batches of 6, K = 2: the last window is short (60 a_b03)
    assert _severity(_LIGHTNING_OWN_DATASET.replace("ROWS", "60"), "AG131") == ["error"]
    # 72 rows: 6 batches per process, a multiple of 2
    assert _severity(_LIGHTNING_OWN_DATASET.replace("ROWS", "72"), "AG131") == []


def test_a_hand_loop_over_a_dataset_class_sized_by_its_constructor() -> None:
    src = """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Pairs(Dataset):
        def __init__(self, n=ROWS):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return torch.randn(4), torch.randn(1)

    ACCUM = 3
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Pairs(), batch_size=5)
    for epoch in range(3):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
            loss.backward()
            if (i + 1) % ACCUM == 0:
                opt.step()
                opt.zero_grad()
    """
    # 50 rows: 10 batches, one left after three windows of 3
    assert _severity(src.replace("ROWS", "50"), "AG117") == ["error"]
    assert _severity(src.replace("ROWS", "45"), "AG117") == []


_GENERATOR_PASS = """
import torch
from torch.utils.data import DataLoader, TensorDataset

ACCUM, MICRO_BS = 3, 8


def make_data():
    x = torch.randn(ROWS, 4)
    y = torch.randn(ROWS, 1)
    return TensorDataset(x, y)


def micro_batches(dataset, epoch):
    loader = DataLoader(dataset, batch_size=MICRO_BS, shuffle=True)
    for i, (x, y) in enumerate(loader):
        yield i, x * 0.5, y


def main():
    ds = make_data()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for i, x, y in micro_batches(ds, epoch):
            (torch.nn.functional.mse_loss(model(x), y) / ACCUM).backward()
            if (i + 1) % ACCUM == 0:
                opt.step()
                opt.zero_grad()
"""


def test_a_pass_through_a_generator_yielding_enumerates_index() -> None:
    # 56 rows: 7 micro-batches a pass, one left after two windows of 3 (60 c_b01); the data
    # reaches the generator through a parameter named otherwise than the caller's variable
    assert _severity(_GENERATOR_PASS.replace("ROWS", "56"), "AG117") == ["error"]
    assert _severity(_GENERATOR_PASS.replace("ROWS", "48"), "AG117") == []
    # cleared at each pass's start: nothing leaks
    cleared = _GENERATOR_PASS.replace("ROWS", "56").replace(
        "    for epoch in range(2):\n", "    for epoch in range(2):\n        opt.zero_grad()\n")
    assert _severity(cleared, "AG117") == []
