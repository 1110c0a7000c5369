"""Shapes from blind rounds 68 and 69 (lint), each with its correct twin:

- a loss term that is a per-micro-batch mean returned by a helper of the file
  (``main_sum, aux = losses(...)`` with ``aux = F.cross_entropy(...)``), added undivided
  beside a term normalised by the window's token count (68 c_b03, AG127);
- a loss divided by K times a count all-reduced on every micro-step (``loss_sum * W /
  (n_global * K)``, the micro-step's tokens over the ranks: 68 b_b01, AG104);
- a clip in a callback method the window fires by name on every micro-batch
  (``self.fire("on_after_backward")`` with ``getattr(cb, name)``: 68 c_b01, AG105);
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
    # the dispatcher's getattr(cb, name) runs every method of that name: the window reaches it
    assert _codes(_CALLBACKS.replace("HOOK", "on_after_backward")).get("AG105") == "error"
    assert "AG105" not in _codes(_CALLBACKS.replace("HOOK", "on_before_optimizer_step"))


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


_ACCEL_PARAM = """
import torch
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup


def make_opt_sched(model, args, n_proc):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=args.warmup * n_proc,
                                            num_training_steps=HORIZON)
    return opt, sched


def main(args, model, ref, data):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
    W = accelerator.num_processes
    n = args.micro_bs * args.accum * W * args.steps
    opt, sched = make_opt_sched(model, args, W)
    loader = torch.utils.data.DataLoader(data[:n], batch_size=args.micro_bs)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
    ropt, rsched = make_opt_sched(ref, args, 1)
"""


def test_a_horizon_times_a_parameter_given_the_number_of_processes() -> None:
    """69 a_b02_fixed: ``args.steps * n_proc`` with ``n_proc`` the world size at the training
    call and 1 at the reference's: counted in scheduler steps (an AG125 warning before)."""
    assert "AG125" not in _codes(_ACCEL_PARAM.replace("HORIZON", "args.steps * n_proc"))
    assert _codes(_ACCEL_PARAM.replace("HORIZON", "args.steps")).get("AG125") == "warning"


_LIGHTNING_INIT = """
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

CFG = {"n": 40, "bs": 4, "accum": ACCUM, "epochs": 2}


class SensorData(pl.LightningDataModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.x = torch.randn(cfg["n"], 10)
        self.y = torch.randn(cfg["n"], 2)

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.cfg["bs"], shuffle=False)


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(10, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=CFG["epochs"],
                     accumulate_grad_batches=CFG["accum"])
trainer.fit(Regressor(), datamodule=SensorData(CFG))
"""


def test_a_datamodule_sized_by_its_constructors_parameter_in_init() -> None:
    """69 a_b03: rows from ``torch.randn(cfg["n"], ...)`` in ``__init__(self, cfg)``, built
    ``SensorData(CFG)``: 10 batches, a tail of 1 at K = 3, none at K = 5."""
    assert _codes(_LIGHTNING_INIT.replace("ACCUM", "3")).get("AG131") == "error"
    assert "AG131" not in _codes(_LIGHTNING_INIT.replace("ACCUM", "5"))


_DDP_HELPER_COUNT = """
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def tokens_in(window):
    return sum(int((lab != -100).sum()) for _, lab in window)


def window_loss_scale(window):
    return DENOM


def main(base, steps, rank, K):
    model = DDP(base)
    model.register_comm_hook(state=None, hook=default_hooks.allreduce_hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for window in steps:
        denom = window_loss_scale(window[rank])
        for i, (ids, labels) in enumerate(window[rank]):
            model.require_backward_grad_sync = i == K - 1
            loss = F.cross_entropy(model(ids), labels, ignore_index=-100, reduction="sum") / denom
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


def test_a_rank_local_count_returned_by_a_helper_under_ddps_averaging_hook() -> None:
    """69 b_b02: the divisor comes from a helper returning this rank's token count; torch's
    own ``allreduce_hook`` keeps DDP's average (it is not a custom reduction)."""
    assert "AG113" in _codes(_DDP_HELPER_COUNT.replace("DENOM", "float(tokens_in(window))"))
    ok = _DDP_HELPER_COUNT.replace(
        "DENOM", "float(tokens_in(window))").replace(
        "        denom = window_loss_scale(window[rank])",
        "        n = torch.tensor(window_loss_scale(window[rank]))\n"
        "        dist.all_reduce(n)\n        denom = n.item() / dist.get_world_size()")
    assert "AG113" not in _codes(ok)


_HAND_ZERO = """
import torch
import torch.distributed as dist
import torch.nn.functional as F


class FlatShardSGD:
    def __init__(self, model, rank, world):
        self.params = list(model.parameters())
        self.world, self.rank = world, rank
        self.master = torch.nn.Parameter(torch.zeros(10))
        self.opt = torch.optim.SGD([self.master], lr=0.1)

    def grad_bucket(self):
        return torch.cat([p.grad.reshape(-1) for p in self.params])

    def reduce_and_step(self):
        bucket = self.grad_bucket()
        out = torch.empty(bucket.numel() // self.world)
        work = dist.reduce_scatter_tensor(out, bucket, op=dist.ReduceOp.SUM, async_op=True)
        work.wait()
        AVERAGE
        self.master.grad = out
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def main(model, data, steps, rank, world):
    zopt = FlatShardSGD(model, rank, world)
    for s in range(steps):
        win = data[s][rank]
        n_tok = torch.tensor(float(sum((t != -100).sum().item() for _, t in win)))
        dist.all_reduce(n_tok)
        for ids, tags in win:
            loss = F.cross_entropy(model(ids), tags, ignore_index=-100, reduction="sum") / n_tok
            loss.backward()
        zopt.reduce_and_step()
"""


def test_a_hand_written_zero_dividing_a_reduce_scatter_by_the_world_again() -> None:
    """69 b_b01: the loss over the all-ranks token count, then the reduce-scattered sum
    divided by W: G / W."""
    assert _codes(_HAND_ZERO.replace("AVERAGE", "out.div_(self.world)")).get("AG123") == "error"
    assert "AG123" not in _codes(_HAND_ZERO.replace("AVERAGE", "pass"))
