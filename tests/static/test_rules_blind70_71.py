"""Shapes from blind rounds 70 and 71 (lint), each with its twin:

- a large-batch reference whose loop names K only where it assembles the window's batch (a
  comprehension over ``range(GAS)``) and sizes it (``MICRO * GAS * world``) is not an
  accumulation loop (70 b_c02: AG101 was a false error);
- a Lightning epoch sized through any tensor of a ``TensorDataset`` (``IDX =
  torch.arange(len(X))`` first, ``X`` with its rows in sight; 70 a_b02, AG131);
- a scheduler stepped in a callback a trainer fires by name through ``getattr`` on every
  micro-batch (70 c_b01, AG103);
- a resume whose skipping ends at the saved index of the window's last micro-batch
  (``if batch_idx < start_batch: continue``; 70 c_b03, AG150)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source


def _codes(src: str) -> dict[str, str]:
    return {f.code: f.severity.value for f in lint_source(textwrap.dedent(src))}


_REFERENCE = """
import torch
import torch.nn.functional as F

GRAD_ACCUM, MICRO, STEPS = 3, 4, 5


def sample(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(MICRO, 8, generator=g), torch.randint(0, 3, (MICRO,), generator=g)


def train_windows(engine, rank, world):
    for step in range(STEPS):
        for k in range(GRAD_ACCUM):
            x, y = sample((step * GRAD_ACCUM + k) * world + rank)
            engine.backward(F.cross_entropy(engine(x), y))
            engine.step()


def reference(net, opt, world):
    for step in range(STEPS):
        xs, ys = zip(*[sample((step * GRAD_ACCUM + k) * world + r) for k in range(GRAD_ACCUM) for r in range(world)])
        loss = F.cross_entropy(net(torch.cat(xs)), torch.cat(ys), reduction="sum") / DIVISOR
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_reference_naming_k_only_to_build_and_size_its_batch() -> None:
    assert "AG101" not in _codes(_REFERENCE.replace("DIVISOR", "(MICRO * GRAD_ACCUM * world)"))
    # a loop that runs K backwards, each divided by K, and steps after each is still judged
    stepping = _REFERENCE.replace("DIVISOR", "(MICRO * GRAD_ACCUM * world)") + """

def accumulate_wrong(net, opt):
    for step in range(STEPS):
        for k in range(GRAD_ACCUM):
            x, y = sample(step * GRAD_ACCUM + k)
            (F.cross_entropy(net(x), y) / GRAD_ACCUM).backward()
            opt.step()
            opt.zero_grad()
"""
    assert "AG101" in _codes(stepping)


_LIGHTNING = """
import argparse
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--accum", type=int, default=4)
p.add_argument("--bs", type=int, default=6)
p.add_argument("--batches", type=int, default=BATCHES)
args = p.parse_args()
X = torch.randn(args.batches * args.bs, 10)
Y = torch.randn(args.batches * args.bs, 2)
IDX = torch.arange(len(X))


class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(10, 2)

    def training_step(self, batch, batch_idx):
        _, x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


dl = DataLoader(TensorDataset(IDX, X, Y), batch_size=args.bs, shuffle=True)
tr = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, accumulate_grad_batches=args.accum)
tr.fit(M(), dl)
"""


def test_an_epoch_sized_through_a_later_tensor_of_the_dataset() -> None:
    assert _codes(_LIGHTNING.replace("BATCHES", "10")).get("AG131") == "error"
    assert "AG131" not in _codes(_LIGHTNING.replace("BATCHES", "8"))


_FIRED_SCHED = """
import torch


class LRSchedulerCallback:
    def __init__(self, scheduler):
        self.scheduler = scheduler

    def HOOK(self, trainer, *a):
        self.scheduler.step()


class Trainer:
    def __init__(self, model, optimizer, accum, callbacks):
        self.model, self.optimizer, self.accum, self.callbacks = model, optimizer, accum, callbacks

    def _fire(self, name, *a):
        for cb in self.callbacks:
            fn = getattr(cb, name, None)
            if fn is not None:
                fn(self, *a)

    def fit(self, loader):
        for batch_idx, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(self.model(x), y) / self.accum
            loss.backward()
            self._fire("on_train_batch_end", batch_idx, loss)
            if (batch_idx + 1) % self.accum == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
                self._fire("on_optimizer_step_end")
"""


def test_a_scheduler_stepped_in_a_callback_fired_on_every_micro_batch() -> None:
    assert _codes(_FIRED_SCHED.replace("HOOK", "on_train_batch_end")).get("AG103") == "error"
    assert "AG103" not in _codes(_FIRED_SCHED.replace("HOOK", "on_optimizer_step_end"))


_SKIP_RESUME = """
import os

import torch


def train(model, opt, loader, ckpt_path, K):
    start_batch = 0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start_batch = RESTORE
    for batch_idx, (x, y) in enumerate(loader):
        if batch_idx < start_batch:
            continue
        (torch.nn.functional.mse_loss(model(x), y) / K).backward()
        if (batch_idx + 1) % K == 0:
            opt.step()
            opt.zero_grad()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "batch_idx": batch_idx}, ckpt_path)
"""


def test_a_resume_that_skips_up_to_the_saved_last_micro_batch_only() -> None:
    assert "AG150" in _codes(_SKIP_RESUME.replace("RESTORE", 'ck["batch_idx"]'))
    assert "AG150" not in _codes(_SKIP_RESUME.replace("RESTORE", 'ck["batch_idx"] + 1'))


_DS_GLOBAL = """
import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F


def train(engine, data, steps, rank, world, K):
    for step in range(steps):
        n_tok = torch.tensor(float(sum(int((t != -100).sum()) for r in data[step] for _, t in r)))
        for x, t in data[step][rank]:
            loss = F.cross_entropy(engine(x), t, ignore_index=-100, reduction="sum") SCALE / n_tok
            engine.backward(loss, scale_wrt_gas=False)
            engine.step()
"""


def test_a_loss_times_the_world_over_a_count_of_every_ranks_data() -> None:
    """71 b_c03: the count is read from every rank's data, never all-reduced; ``* world``
    above the line says it is the window's count over the ranks (an AG113 warning before)."""
    assert "AG113" not in _codes(_DS_GLOBAL.replace("SCALE", "* world"))
    assert "AG113" in _codes(_DS_GLOBAL.replace("SCALE", ""))
