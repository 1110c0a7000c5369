"""Shapes from blind rounds 68 and 69 (lint), each with its correct twin:

- a loss term that is a per-micro-batch mean returned by a helper of the file
  (``main_sum, aux = losses(...)`` with ``aux = F.cross_entropy(...)``), added undivided
  beside a term normalised by the window's token count (68 c_b03, AG127);
- a loss divided by K times a count all-reduced on every micro-step (``loss_sum * W /
  (n_global * K)``, the micro-step's tokens over the ranks: 68 b_b01, AG104);
- a clip in a callback method the window fires by name on every micro-batch
  (``self.fire("on_after_backward")``: 68 c_b01, AG138);
- a clip before the script's own all-reduce of the gradients (68 b_b03, AG105), and a GAN
  that syncs, clips and steps D before G's window is synchronised (65 c_c03: no finding)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source


def _codes(src: str) -> dict[str, str]:
    return {f.code: f.severity.value for f in lint_source(textwrap.dedent(src))}


_AUX = """
import torch
import torch.nn.functional as F

K = 4


def losses(model, batch):
    src, tgt, mask, bucket = batch
    logits, aux_logits = model(src)
    main_sum = (F.cross_entropy(logits.transpose(1, 2), tgt, reduction="none") * mask).sum()
    aux = F.cross_entropy(aux_logits, bucket)
    return main_sum, aux


def train(model, opt, micro, steps):
    for s in range(steps):
        window = micro[s * K:(s + 1) * K]
        n_tok = sum(int(b[2].sum()) for b in window)
        for batch in window:
            main_sum, aux = losses(model, batch)
            loss = main_sum / n_tok + 0.2 * AUX
            loss.backward()
        opt.step()
        opt.zero_grad()
"""


def test_a_helper_returned_micro_mean_beside_a_window_normalised_term() -> None:
    assert _codes(_AUX.replace("AUX", "aux")).get("AG127") == "error"
    assert "AG127" not in _codes(_AUX.replace("AUX", "aux / K"))


_PER_MICRO_COUNT = """
import torch
import torch.distributed as dist


def train(ddp, opt, data, steps, world, grad_accum):
    for s in range(steps):
        COUNT_BEFORE
        for k in range(grad_accum):
            ids, tags, mask = data[s][k]
            ddp.require_backward_grad_sync = k == grad_accum - 1
            logits = ddp(ids)
            loss_sum = (torch.nn.functional.cross_entropy(logits, tags, reduction="none") * mask).sum()
            COUNT_INSIDE
            loss = loss_sum * world / DIVISOR
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


def test_a_loss_over_k_times_a_count_all_reduced_per_micro_step() -> None:
    bug = (_PER_MICRO_COUNT.replace("COUNT_BEFORE", "pass")
           .replace("COUNT_INSIDE", "n_global = mask.sum().float()\n            dist.all_reduce(n_global)")
           .replace("DIVISOR", "(n_global * grad_accum)"))
    assert "AG104" in _codes(bug)
    ok = (_PER_MICRO_COUNT
          .replace("COUNT_BEFORE", "n_global = sum(data[s][k][2].sum() for k in range(grad_accum)).float()\n"
                   "        dist.all_reduce(n_global)")
          .replace("COUNT_INSIDE", "pass").replace("DIVISOR", "n_global"))
    assert "AG104" not in _codes(ok)


_CALLBACKS = """
import torch


class GradClip:
    def __init__(self, max_norm):
        self.max_norm = max_norm

    def HOOK(self, engine):
        torch.nn.utils.clip_grad_norm_(engine.model.parameters(), self.max_norm)


class Engine:
    def __init__(self, model, opt, accum, callbacks):
        self.model, self.opt, self.accum, self.cbs = model, opt, accum, callbacks

    def fire(self, name):
        for cb in self.cbs:
            if hasattr(cb, name):
                getattr(cb, name)(self)

    def run(self, loader):
        for i, (x, t) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(self.model(x), t) / self.accum
            loss.backward()
            self.fire("on_after_backward")
            if (i + 1) % self.accum == 0:
                self.fire("on_before_optimizer_step")
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
"""


def test_a_clip_in_a_callback_the_window_fires_on_every_micro_batch() -> None:
    assert _codes(_CALLBACKS.replace("HOOK", "on_after_backward")).get("AG138") == "error"
    assert "AG138" not in _codes(_CALLBACKS.replace("HOOK", "on_before_optimizer_step"))


_HAND_SYNC = """
import torch
import torch.distributed as dist


def sync(params, world):
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    torch.nn.utils.vector_to_parameters(flat, grads)


def worker(model, opt, data, steps, K, world):
    params = list(model.parameters())
    for s in range(steps):
        for k in range(K):
            x, y = data[s][k]
            loss = torch.nn.functional.cross_entropy(model(x), y) / K
            loss.backward()
        ORDER
        opt.step()
        opt.zero_grad()
"""


def test_a_clip_before_the_hand_written_all_reduce() -> None:
    clip = "torch.nn.utils.clip_grad_norm_(params, 1.0)"
    assert _codes(_HAND_SYNC.replace("ORDER", f"{clip}\n        sync(params, world)")) \
        .get("AG105") == "error"
    assert "AG105" not in _codes(_HAND_SYNC.replace("ORDER", f"sync(params, world)\n        {clip}"))


_GAN = """
import torch
import torch.distributed as dist


def allreduce_grads(m):
    for p in m.parameters():
        dist.all_reduce(p.grad)


def train(G, D, og, od, batches, n_window):
    for win in batches:
        for real, z in win:
            d_loss = (D(real).sum() - D(G(z).detach()).sum()) / n_window
            d_loss.backward()
        allreduce_grads(D)
        torch.nn.utils.clip_grad_norm_(D.parameters(), 1.0)
        od.step()
        od.zero_grad()
        for _, z in win:
            g_loss = -D(G(z)).sum() / n_window
            g_loss.backward()
        allreduce_grads(G)
        torch.nn.utils.clip_grad_norm_(G.parameters(), 1.0)
        og.step()
        og.zero_grad()
"""


def test_a_clip_stepped_before_another_models_sync_is_not_before_its_own() -> None:
    assert "AG105" not in _codes(_GAN)


_RESUME = """
import torch


class Trainer:
    def __init__(self, model, opts, ckpt, accum):
        self.model, self.opts, self.ckpt, self.accum = model, opts, ckpt, accum
        self.micro_step = 0
        self.global_step = 0

    def on_step_end(self):
        if self.global_step == 2:
            torch.save({"model": self.model.state_dict(), "opts": [o.state_dict() for o in self.opts],
                        "micro_step": self.micro_step, "global_step": self.global_step}, self.ckpt)
            raise KeyboardInterrupt

    def resume(self):
        s = torch.load(self.ckpt)
        self.model.load_state_dict(s["model"])
        self.micro_step, self.global_step = s["micro_step"], s["global_step"]

    def optimizer_step(self):
        for o in self.opts:
            o.step()
            o.zero_grad()
        self.global_step += 1
        self.on_step_end()

    def fit(self, buffer):
        for batch in buffer[self.global_step * self.accum:]:
            (self.model(batch).mean() / self.accum).backward()
            BODY
"""


def test_a_counter_saved_before_its_increment_with_several_optimizers_state() -> None:
    bug = _RESUME.replace("BODY", "if (self.micro_step + 1) % self.accum == 0:\n"
                          "                self.optimizer_step()\n"
                          "            self.micro_step += 1")
    assert "AG150" in _codes(bug)
    ok = _RESUME.replace("BODY", "self.micro_step += 1\n"
                         "            if self.micro_step % self.accum == 0:\n"
                         "                self.optimizer_step()")
    assert "AG150" not in _codes(ok)


_LIGHTNING_SUBSET = """
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset


class Cfg:
    rows = 104
    val_rows = 12
    bs = 8
    accum = ACCUM


class DM(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.batch_size = Cfg.bs

    def setup(self, stage=None):
        ds = TensorDataset(torch.randn(Cfg.rows, 10), torch.randn(Cfg.rows, 2))
        self.train = Subset(ds, range(Cfg.val_rows, Cfg.rows))

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=False)


class Reg(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(10, 2)

    def window_rows(self, batch_idx):
        return self.trainer.accumulate_grad_batches * self.trainer.datamodule.batch_size

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, accumulate_grad_batches=Cfg.accum)
trainer.fit(Reg(), datamodule=DM())
"""


def test_a_lightning_epoch_tail_over_a_subset_sized_by_a_config_class() -> None:
    # 92 rows in batches of 8: 12 batches per epoch, a tail of 2 at K = 5, none at K = 4; the
    # helper that reads accumulate_grad_batches is never called: it scales nothing
    assert _codes(_LIGHTNING_SUBSET.replace("ACCUM", "5")).get("AG131") == "error"
    assert "AG131" not in _codes(_LIGHTNING_SUBSET.replace("ACCUM", "4"))


_ENUM_START = """
import itertools
import os

import torch


def train(model, opt, stream, ckpt_path, K):
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        global_step = ck["step"]
    else:
        global_step = 0
    batches = itertools.islice(stream, global_step * K, None)
    for it, batch in enumerate(batches, start=START):
        (model(batch).mean() / K).backward()
        if (it + 1) % K == 0:
            opt.step()
            opt.zero_grad()
            global_step += 1
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "step": global_step}, ckpt_path)
"""


def test_a_resumed_micro_index_started_at_the_count_of_optimizer_steps() -> None:
    """69 c_b02: ``enumerate(batches, start=global_step)`` after a resume: the index the
    boundary tests modulo K starts at S, not S x K (the data skipped is S x K batches)."""
    assert "AG150" in _codes(_ENUM_START.replace("START", "global_step"))
    assert "AG150" not in _codes(_ENUM_START.replace("START", "global_step * K"))
