"""Shapes from blind rounds 62-66 (lint):

- gradients summed by hand over ranks are right when the loss was divided by a count
  all-reduced with SUM and read out as a number (``n = counts.item()``; 62 c_c03);
- a step branch that leaves the loop (``return`` at a preemption) before the loop's counter
  increment saves a counter one short of the micro-batches consumed (62 c_b02);
- an enumerate index saved at the boundary and passed back, as saved, as the start of the
  resumed loop through a function's parameter (63 c_b03);
- a loss over a count all-reduced on every micro-step (this micro-step's tokens over the
  ranks), then divided by K: a mean of per-micro-step means (64 b_b01);
- an optimizer of the file's own class stepped with a closure that runs the backward
  (``opt.step(closure)``, SAM or LBFGS style): one step per iteration, no window (64 c_c03);
- a scheduler stepped on every ``training_step`` of Lightning's manual optimisation whose
  backwards run in a loop over the toggled optimizers (64 a_b02);
- a schedule's counter of optimizer steps started at ``epoch * len(loader)`` (64 c_b01);
- correct code of round 65: a reference over a generator yielding K-sized slices of
  micro-batches, a GAN with two GradScalers each clipping after its own unscale, gradients
  summed by hand over a loss divided by a count times the world size (65 c_c01, c_c03);
- the loss's 1/K handed as a scale to a backward helper made by a factory, with the pass's
  tail stepped (66 c_b03); a Trainer's model built by a function of the file (66 a_b01); a
  DataModule storing its sizes with a tuple assignment from the command line's fields
  (66 a_b02); an Accelerate horizon divided by a product holding the number of processes
  (66 a_b03)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source


def _severity(src: str, code: str) -> list[str]:
    return [f.severity.value for f in lint_source(textwrap.dedent(src)) if f.code == code]


_HAND_SUM = """
import torch
import torch.distributed as dist


def worker(rank, world, model, opt, batches, K):
    for update in range(10):
        steps = torch.tensor([float(sum(b[0].size(0) for b in batches[update]))])
        dist.all_reduce(steps OP)
        total_steps = steps.item()
        opt.zero_grad(set_to_none=True)
        for obs, target in batches[update]:
            loss = torch.nn.functional.mse_loss(model(obs), target, reduction="sum") / total_steps
            loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        opt.step()
"""


def test_summed_gradients_over_a_loss_divided_by_a_summed_count_read_as_a_number() -> None:
    assert _severity(_HAND_SUM.replace(" OP", ""), "AG107") == []
    # the count's MAX over ranks is no total: the summed gradients are W x too large
    assert _severity(_HAND_SUM.replace(" OP", ", op=dist.ReduceOp.MAX"), "AG107") == ["error"]


_PREEMPTED = """
import torch


class Trainer:
    def __init__(self, model, opt, accum):
        self.model, self.opt, self.accum = model, opt, accum
        self.step = 0
        self.micro_step = 0

    def save(self, path):
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                    "step": self.step, "micro_step": self.micro_step}, path)

    def load(self, path):
        ck = torch.load(path)
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.step = ck["step"]
        self.micro_step = ck["micro_step"]

    def fit(self, loader, stop_at=None):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(self.model(x), y) / self.accum
            loss.backward()
            if (self.micro_step + 1) % self.accum == 0:
                self.opt.step()
                self.opt.zero_grad()
                self.step += 1
                if stop_at is not None and self.step >= stop_at:
                    return "preempted"
            self.micro_step += 1
        return "done"
"""


def test_leaving_the_step_branch_before_the_counter_is_counted() -> None:
    assert _severity(_PREEMPTED, "AG150") == ["warning"]
    # counted first, then tested: the counter is whole when the branch leaves
    counted_first = _PREEMPTED.replace(
        "            if (self.micro_step + 1) % self.accum == 0:",
        "            self.micro_step += 1\n            if self.micro_step % self.accum == 0:",
    ).replace("            self.micro_step += 1\n        return", "        return")
    assert _severity(counted_first, "AG150") == []
    # the counter is not restored from the checkpoint: its value at the stop is never reused
    not_restored = _PREEMPTED.replace('        self.micro_step = ck["micro_step"]\n', "")
    assert _severity(not_restored, "AG150") == []


_RESUMED_SEGMENT = """
import itertools
import torch


def train_segment(model, opt, loader, K, start_micro, ckpt=None):
    batches = itertools.islice(loader, start_micro, None)
    for micro, (x, y) in enumerate(batches, start=start_micro):
        (torch.nn.functional.mse_loss(model(x), y) / K).backward()
        if (micro + 1) % K == 0:
            opt.step()
            opt.zero_grad()
            if ckpt is not None:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "micro": micro}, ckpt)


def main(model, opt, loader, ckpt):
    train_segment(model, opt, loader, 4, 0, ckpt)
    st = torch.load(ckpt)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    train_segment(model, opt, loader, 4, START)
"""


def test_a_saved_loop_index_passed_back_as_the_resumed_loops_start() -> None:
    assert _severity(_RESUMED_SEGMENT.replace("START", 'st["micro"]'), "AG150") == ["warning"]
    assert _severity(_RESUMED_SEGMENT.replace("START", 'st["micro"] + 1'), "AG150") == []


_REFERENCE_STRIDE = """
import math
import torch

K, BS = 4, 4


def windows(batches, k):
    for i in range(0, len(batches), k):
        yield batches[i:i + k]


def train(model, opt, loader):
    for win in windows(list(loader), K):
        cnt = sum(len(yb) for _, yb in win)
        for xb, yb in win:
            (torch.nn.functional.cross_entropy(model(xb), yb, reduction="sum") / cnt).backward()
        opt.step()
        opt.zero_grad()


def reference(ref, ropt, ds, order):
    n_micro = math.ceil(len(order) / BS)
    for w0 in range(0, n_micro, STRIDE):
        idx = order[w0 * BS:(w0 + K) * BS]
        xb, yb = ds[idx]
        ropt.zero_grad()
        (torch.nn.functional.cross_entropy(ref(xb), yb, reduction="sum") / len(idx)).backward()
        ropt.step()
"""


def test_a_loop_striding_over_micro_batch_positions_takes_whole_windows() -> None:
    # 63 b_c03: the reference steps (and clears) once per K micro-batch positions; K is not
    # otherwise known as the accumulation count in the file
    found = lint_source(textwrap.dedent(_REFERENCE_STRIDE.replace("STRIDE", "K")))
    assert not [f.code for f in found if f.code in ("AG101", "AG102")]
    # the same loop over every micro-batch position clears on each of them
    assert _severity(_REFERENCE_STRIDE.replace("STRIDE", "1"), "AG102") == ["error"]


_PER_MICRO_GLOBAL = """
import torch
import torch.distributed as dist


def train(ddp, batches, opt, K, world, steps):
    for step in range(steps):
        WINDOW_COUNT
        for micro in range(K):
            ids = batches[step * K + micro]
            ddp.require_backward_grad_sync = micro == K - 1
            loss_sum, n_tok = lm_loss_sum(ddp, ids)
            PER_MICRO
            loss = loss_sum * world / n_glob
            (loss / K).backward()
        opt.step()
        opt.zero_grad()
"""


def test_a_count_all_reduced_on_every_micro_step_then_divided_by_k() -> None:
    per_micro = _PER_MICRO_GLOBAL.replace("WINDOW_COUNT", "pass").replace(
        "PER_MICRO", "n_glob = n_tok.to(torch.float32)\n            dist.all_reduce(n_glob)")
    assert _severity(per_micro, "AG104") == ["warning"]
    # the window's count, all-reduced once before its micro-steps: the large batch's mean
    window = _PER_MICRO_GLOBAL.replace(
        "WINDOW_COUNT", "n_glob = sum(count(batches[step * K + m]) for m in range(K)).float()\n"
        "        dist.all_reduce(n_glob)").replace("PER_MICRO", "pass").replace("(loss / K)", "loss")
    assert _severity(window, "AG104") == []


_CLOSURE_STEP = """
import torch


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        with torch.enable_grad():
            closure()
        self.base_optimizer.step()


def make_opt(model, args):
    return SAM(model.parameters(), torch.optim.SGD, rho=args.rho, lr=args.lr)


def main(args, model, ref, X, Y):
    opt = make_opt(model, args)
    for step in range(args.steps):
        xs = X[step * args.window:(step + 1) * args.window]
        ys = Y[step * args.window:(step + 1) * args.window]
        micro = list(zip(xs.tensor_split(args.accum), ys.tensor_split(args.accum)))

        def closure():
            for xb, yb in micro:
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
                (loss * (len(yb) / args.window)).backward()

        opt.zero_grad()
        closure()
        opt.step(closure)

    ropt = make_opt(ref, args)
    for step in range(args.steps):
        xs = X[step * args.window:(step + 1) * args.window]
        ys = Y[step * args.window:(step + 1) * args.window]

        def rclosure():
            loss = torch.nn.functional.cross_entropy(ref(xs), ys)
            loss.backward()
            return loss

        ropt.zero_grad()
        rclosure()
        ropt.step(STEP_ARG)
"""


def test_an_optimizer_stepped_with_the_backwards_closure_is_one_step_per_iteration() -> None:
    found = lint_source(textwrap.dedent(_CLOSURE_STEP.replace("STEP_ARG", "rclosure")))
    assert not [f for f in found if f.severity.value == "error"], found
    # stepped without the closure, the optimizer of a factory is not seen stepping: the clear
    # in a loop of backwards stays a finding
    assert _severity(_CLOSURE_STEP.replace("STEP_ARG", ""), "AG102") == ["error"]


_TOGGLED = """
import torch
import pytorch_lightning as pl


class TwoOpt(pl.LightningModule):
    def __init__(self, K):
        super().__init__()
        self.automatic_optimization = False
        self.K = K

    def training_step(self, batch, batch_idx):
        opt_enc, opt_head = self.optimizers()
        sch_enc, sch_head = self.lr_schedulers()
        x, y = batch
        for opt in (opt_enc, opt_head):
            self.toggle_optimizer(opt)
            loss = torch.nn.functional.cross_entropy(self(x), y) / self.K
            self.manual_backward(loss)
            self.untoggle_optimizer(opt)
        if (batch_idx + 1) % self.K == 0:
            for opt in (opt_enc, opt_head):
                opt.step()
                opt.zero_grad()
SCHEDULERS
        return loss
"""


def test_schedulers_stepped_on_every_manual_training_step_over_toggled_optimizers() -> None:
    every = _TOGGLED.replace("SCHEDULERS", "        sch_enc.step()\n        sch_head.step()")
    assert _severity(every, "AG103") == ["error", "error"]
    gated = _TOGGLED.replace("SCHEDULERS", "            sch_enc.step()\n            sch_head.step()")
    assert _severity(gated, "AG103") == []


_TIMM_EPOCH = """
import torch


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, lr_scheduler):
    accum_steps = args.grad_accum_steps
    updates_per_epoch = (len(loader) + accum_steps - 1) // accum_steps
    num_updates = START
    optimizer.zero_grad()
    for batch_idx, (input, target) in enumerate(loader):
        need_update = (batch_idx + 1) % accum_steps == 0 or batch_idx == len(loader) - 1
        loss = loss_fn(model(input), target) / accum_steps
        loss.backward()
        if not need_update:
            continue
        optimizer.step()
        optimizer.zero_grad()
        num_updates += 1
        lr_scheduler.step_update(num_updates=num_updates)
    return num_updates
"""


def test_a_schedules_update_counter_started_at_the_micro_batches_before() -> None:
    assert _severity(_TIMM_EPOCH.replace("START", "epoch * len(loader)"), "AG130") == ["error"]
    assert _severity(_TIMM_EPOCH.replace("START", "epoch * updates_per_epoch"), "AG130") == []


_WINDOW_STREAM = """
import torch


def window_stream(micro, accum, start_window=0):
    w = start_window
    while (w + 1) * accum <= len(micro):
        yield w, micro[w * accum:(w + 1) * accum]
        w += 1


def reference(model, opt, micro, c):
    for _, mbs in STREAM:
        ids = torch.cat([m[0] for m in mbs])
        lab = torch.cat([m[1] for m in mbs])
        loss = torch.nn.functional.cross_entropy(model(ids), lab, reduction="sum") / len(lab)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


def test_a_loop_over_a_generator_of_k_sized_slices_runs_whole_windows() -> None:
    found = lint_source(textwrap.dedent(_WINDOW_STREAM.replace("STREAM", "window_stream(micro, c.accum)")))
    assert not [f for f in found if f.severity.value == "error"], found
    # the same loop over the micro-batches one by one steps on each of them
    assert _severity(_WINDOW_STREAM.replace("STREAM", "enumerate(micro_batches(micro, c.accum))"),
                     "AG101") == ["error"]


_TWO_SCALERS = """
import torch
import torch.distributed as dist


def allreduce_grads(module):
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def train(a, G, D, og, od, batches, rank, world):
    sc_g = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    sc_d = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    n_window = a.micro * a.accum * world
    for s, win in enumerate(batches):
        for real, z in win:
            d_loss = (torch.nn.functional.softplus(-D(real)).sum() + D(G(z).detach()).sum()) / DIVISOR
            sc_d.scale(d_loss).backward()
        allreduce_grads(D)
        sc_d.unscale_(od)
        torch.nn.utils.clip_grad_norm_(D.parameters(), a.clip)
        sc_d.step(od)
        sc_d.update()
        od.zero_grad(set_to_none=True)
        for _, z in win:
            g_loss = torch.nn.functional.softplus(-D(G(z))).sum() / DIVISOR
            sc_g.scale(g_loss).backward()
        allreduce_grads(G)
        sc_g.unscale_(og)
        torch.nn.utils.clip_grad_norm_(G.parameters(), a.clip)
        sc_g.step(og)
        sc_g.update()
        og.zero_grad(set_to_none=True)


def reference(model, opt, x, y):
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
"""


def test_two_scalers_each_clipping_after_its_unscale_and_a_world_sized_divisor() -> None:
    found = lint_source(textwrap.dedent(_TWO_SCALERS.replace("DIVISOR", "n_window")))
    assert not [f for f in found if f.severity.value == "error"], found
    # a count of one rank's data: the hand-summed gradients are W x the mean
    assert _severity(_TWO_SCALERS.replace("DIVISOR", "(a.micro * a.accum)"), "AG107") == ["error"]


_LIGHTNING_MANUAL_TAIL = """
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

HP = {"rows": ROWS, "batch": 4, "accum": 2, "epochs": 3}


class Pairs(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        N = HP["accum"]
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y) / N
        self.manual_backward(loss)
        if GATE:
            opt.step()
            opt.zero_grad()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    ds = TensorDataset(torch.randn(HP["rows"], 8), torch.randn(HP["rows"], 1))
    trainer = pl.Trainer(max_epochs=HP["epochs"], accelerator="cpu", devices=1)
    trainer.fit(Pairs(), DataLoader(ds, batch_size=HP["batch"]))
"""


def test_lightning_manual_optimisation_leaks_an_epochs_tail() -> None:
    # 20 rows, 5 batches of 4, windows of 2: one batch left per epoch (65 a_b02)
    gate = "(batch_idx + 1) % N == 0"
    assert _severity(_LIGHTNING_MANUAL_TAIL.replace("ROWS", "20").replace("GATE", gate),
                     "AG117") == ["error"]
    assert _severity(_LIGHTNING_MANUAL_TAIL.replace("ROWS", "16").replace("GATE", gate),
                     "AG117") == []
    closed = gate + " or self.trainer.is_last_batch"
    assert _severity(_LIGHTNING_MANUAL_TAIL.replace("ROWS", "20").replace("GATE", closed),
                     "AG117") == []


_FACTORY_STEP = """
import torch

CFG = {"accum": 4}


def make_step_fns(policy, opt, cfg):
    def accumulate(batch, scale):
        loss = torch.nn.functional.mse_loss(policy(batch[0]), batch[1]) * scale
        loss.backward()
        return loss.item()

    def apply():
        opt.step()
        opt.zero_grad(set_to_none=True)

    return accumulate, apply


def main(policy, opt, dl):
    cfg = CFG
    accumulate, apply = make_step_fns(policy, opt, cfg)
    n_micro = len(dl)
    for i, batch in enumerate(dl):
        accumulate(batch, SCALE)
        if (i + 1) % cfg["accum"] == 0 or (i + 1) == n_micro:
            apply()
"""


def test_the_tails_scale_handed_to_a_backward_helper() -> None:
    assert _severity(_FACTORY_STEP.replace("SCALE", '1.0 / cfg["accum"]'), "AG141") == ["warning"]
    own = '1.0 / min(cfg["accum"], n_micro - (i // cfg["accum"]) * cfg["accum"])'
    assert _severity(_FACTORY_STEP.replace("SCALE", own), "AG141") == []


_TRAINER_FACTORY = """
import torch
from transformers import Trainer, TrainingArguments


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.out = torch.nn.Linear(8, 5)

    def forward(self, input_ids, labels=None):
        return {"logits": self.out(input_ids)}


class TagTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(inputs["input_ids"])["logits"]
        s = torch.nn.functional.cross_entropy(logits, inputs["labels"], reduction="sum")
        n = inputs["labels"].ne(-100).sum()
        return s / (num_items_in_batch if num_items_in_batch is not None else n)


def build():
    return Tagger()


def main(ds):
    model = build()
    args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
    TagTrainer(model=model, args=args, train_dataset=ds).train()
"""


def test_a_trainer_model_built_by_a_function_of_the_file() -> None:
    assert _severity(_TRAINER_FACTORY, "AG118") == ["warning"]
    kwargs = _TRAINER_FACTORY.replace("def forward(self, input_ids, labels=None):",
                                      "def forward(self, input_ids, labels=None, **kwargs):")
    assert _severity(kwargs, "AG118") == []


_DM_FIELDS = """
import argparse
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=ROWS)
    p.add_argument("--bs", type=int, default=4)
    p.add_argument("--accum", type=int, default=3)
    return p.parse_args()


class TabularDM(pl.LightningDataModule):
    def __init__(self, n, bs):
        super().__init__()
        self.n, self.bs = n, bs

    def setup(self, stage=None):
        x = torch.randn(self.n, 10)
        y = torch.randn(self.n, 2)
        self.ds = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=self.bs, shuffle=False)


def main():
    hp = get_args()
    dm = TabularDM(hp.n, hp.bs)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, accumulate_grad_batches=hp.accum)
    trainer.fit(Regressor(hp), datamodule=dm)
"""


def test_a_datamodule_sized_by_a_tuple_assignment_of_fields() -> None:
    # 28 rows, batches of 4: 7 a pass, K = 3 leaves 1 (66 a_b02); 24 rows: 6, whole windows
    assert _severity(_DM_FIELDS.replace("ROWS", "28"), "AG131") == ["error"]
    assert _severity(_DM_FIELDS.replace("ROWS", "24"), "AG131") == []


_ACC_HORIZON = """
import torch
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

ACCUM = 2


def main(model, dl):
    acc = Accelerator(gradient_accumulation_steps=ACCUM)
    total_steps = len(dl) // (acc.num_processes * ACCUM)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=TOTAL)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    for batch in dl:
        with acc.accumulate(model):
            acc.backward(model(batch).sum())
            opt.step()
            sched.step()
            opt.zero_grad()
"""


def test_an_accelerate_horizon_divided_by_a_product_holding_the_processes() -> None:
    assert _severity(_ACC_HORIZON.replace("TOTAL", "total_steps"), "AG125") == ["error"]
    assert _severity(_ACC_HORIZON.replace("TOTAL", "total_steps * acc.num_processes"), "AG125") == []
