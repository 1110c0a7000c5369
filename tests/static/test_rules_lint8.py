"""Statically decidable classes lint used to miss, in several spellings each, against their
correct twins: the scheduler stepped on every micro-batch inside the backward helper the loop
calls (AG103); an optimizer stepped in a post-accumulate-grad hook while the loop
accumulates (AG137)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from accumguard.static.lint import lint_file, lint_source


def found(src: str) -> list[tuple[str, int, str]]:
    return [(f.code or "", f.line or 0, f.severity.value) for f in lint_source(textwrap.dedent(src))]


# ---------------------------------------------------------------- 1. F4 in a backward helper

_SCHED_FUNC = """
import torch

def train_one(model, batch, opt, sched, it, k=4):
    loss = model(batch).mean() / k
    loss.backward()
    if (it + 1) % k == 0:
        opt.step()
        opt.zero_grad()
        {in_branch}
    {after}

def run(model, loader, opt, sched):
    for it, batch in enumerate(loader):
        train_one(model, batch, opt, sched, it)
"""

_SCHED_METHOD = """
import torch

class Runner:
    def __init__(self, model, loader, k):
        self.model, self.loader, self.k = model, loader, k
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)

    def one(self, batch, it):
        (self.model(batch).mean() / self.k).backward()
        if (it + 1) % self.k == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
            {in_branch}
        {after}

    def fit(self):
        for it, batch in enumerate(self.loader):
            self.one(batch, it)
"""

_SCHED_SCALER = """
import torch
from transformers import get_linear_schedule_with_warmup

def step_fn(model, batch, optimizer, scheduler, scaler, step, k):
    with torch.autocast("cuda"):
        loss = model(batch).loss / k
    scaler.scale(loss).backward()
    if step % k == k - 1:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        {in_branch}
    {after}

def main(model, loader):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = get_linear_schedule_with_warmup(optimizer, 100, 1000)
    scaler = torch.cuda.amp.GradScaler()
    step = 0
    for batch in loader:
        step_fn(model, batch, optimizer, scheduler, scaler, step, 4)
        step += 1
"""

_SCHED_CASES = [(_SCHED_FUNC, "sched.step()", 11), (_SCHED_METHOD, "self.lr_scheduler.step()", 16),
                (_SCHED_SCALER, "scheduler.step()", 14)]


@pytest.mark.parametrize(("template", "call", "line"), _SCHED_CASES)
def test_scheduler_stepped_per_micro_batch_in_helper_is_f4(template: str, call: str, line: int) -> None:
    assert found(template.format(in_branch="pass", after=call)) == [("AG103", line, "error")]


@pytest.mark.parametrize(("template", "call", "line"), _SCHED_CASES)
def test_scheduler_stepped_at_the_helpers_boundary_is_silent(template: str, call: str, line: int) -> None:
    assert found(template.format(in_branch=call, after="pass")) == []


# ---------------------------------------------------------------- 2. F1: optimizer fused into backward

_FUSED_INNER = """
import torch

ACCUM = 4
model = torch.nn.Linear(8, 1)
optims = {{p: torch.optim.AdamW([p], lr=1e-3) for p in model.parameters()}}
boundary = [False]

def hook(p):
    {hook_body}

for p in model.parameters():
    p.register_post_accumulate_grad_hook(hook)

for step in range(100):
    {loop}
"""
_INNER_LOOP = """for k in range(ACCUM):
        boundary[0] = k == ACCUM - 1
        x, y = next(data)
        (torch.nn.functional.mse_loss(model(x), y) / ACCUM).backward()"""
_ONE_BACKWARD = """x, y = next(data)
    torch.nn.functional.mse_loss(model(x), y).backward()"""
_STEP = "optims[p].step()\n    optims[p].zero_grad()"
_GATED = "if boundary[0]:\n        optims[p].step()\n        optims[p].zero_grad()"

_FUSED_NESTED = """
import torch

def train(model, loader, sched, k=8):
    optimizer_dict = {{p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}}
    last = [False]

    def optimizer_hook(param):
        {hook_body}

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(optimizer_hook)

    for i, batch in enumerate(loader):
        {loop}
"""
_MOD_LOOP = """last[0] = (i + 1) % k == 0
        (model(batch).mean() / k).backward()
        if (i + 1) % k == 0:
            sched.step()"""
_NESTED_ONE = """model(batch).mean().backward()
        sched.step()"""
_N_STEP = "optimizer_dict[param].step()\n        optimizer_dict[param].zero_grad()"
_N_GATED = "if last[0]:\n            optimizer_dict[param].step()\n            optimizer_dict[param].zero_grad()"

_FUSED_CLASS = """
import functools
import torch

class FusedTrainer:
    def __init__(self, model, grad_accum_steps):
        self.model = model
        self.grad_accum_steps = grad_accum_steps
        self.at_boundary = False
        self.opts = {{}}
        for p in model.parameters():
            self.opts[p] = torch.optim.AdamW([p], lr=1e-4)
            p.register_post_accumulate_grad_hook(functools.partial(self._apply, tag="x"))

    def _apply(self, p, tag):
        {hook_body}

    def fit(self, loader):
        for batch in loader:
            {loop}
"""
_CLASS_LOOP = "(self.model(batch).loss / self.grad_accum_steps).backward()"
_CLASS_ONE = "self.model(batch).loss.backward()"
_C_STEP = "self.opts[p].step()\n        self.opts[p].zero_grad(set_to_none=True)"
_C_GATED = "if self.at_boundary:\n            self.opts[p].step()"

_FUSED_CASES = [
    (_FUSED_INNER, _STEP, _GATED, _INNER_LOOP, _ONE_BACKWARD, 10),
    (_FUSED_NESTED, _N_STEP, _N_GATED, _MOD_LOOP, _NESTED_ONE, 9),
    (_FUSED_CLASS, _C_STEP, _C_GATED, _CLASS_LOOP, _CLASS_ONE, 16),
]


@pytest.mark.parametrize(("template", "step", "gated", "accum", "one", "line"), _FUSED_CASES)
def test_optimizer_in_backward_with_accumulation_is_f1(
        template: str, step: str, gated: str, accum: str, one: str, line: int) -> None:
    assert found(template.format(hook_body=step, loop=accum)) == [("AG137", line, "error")]


@pytest.mark.parametrize(("template", "step", "gated", "accum", "one", "line"), _FUSED_CASES)
def test_optimizer_in_backward_without_accumulation_is_silent(
        template: str, step: str, gated: str, accum: str, one: str, line: int) -> None:
    assert found(template.format(hook_body=step, loop=one)) == []


@pytest.mark.parametrize(("template", "step", "gated", "accum", "one", "line"), _FUSED_CASES)
def test_optimizer_in_backward_gated_on_the_boundary_is_silent(
        template: str, step: str, gated: str, accum: str, one: str, line: int) -> None:
    assert found(template.format(hook_body=gated, loop=accum)) == []


# ---------------------------------------------------------------- 3. F8: clipping in Lightning's backward hooks

_LIT_MODULE = """
import torch
import pytorch_lightning as pl

class LitModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def {hook}(self, *args):
        {clip}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches={k})
trainer.fit(LitModel(), loader)
"""

_LIT_CALLBACK = """
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback

ACC = {k}

class ClipCallback(Callback):
    def {hook}(self, trainer, pl_module, *args):
        {clip}

trainer = Trainer(callbacks=[ClipCallback()], accumulate_grad_batches=ACC)
trainer.fit(model, loader)
"""

_NORM = "torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm=1.0)"
_LIT_GRAD = "self.clip_gradients(self.optimizers(), gradient_clip_val=0.5, gradient_clip_algorithm='norm')"
_CB_NORM = "torch.nn.utils.clip_grad_norm_(pl_module.parameters(), 1.0)"

_LIT_CASES = [(_LIT_MODULE, _NORM, 15), (_LIT_MODULE, _LIT_GRAD, 15), (_LIT_CALLBACK, _CB_NORM, 10)]


@pytest.mark.parametrize("hook", ["on_after_backward", "on_before_backward"])
@pytest.mark.parametrize(("template", "clip", "line"), _LIT_CASES)
def test_clip_in_lightning_backward_hook_with_accumulation_is_f8(
        template: str, clip: str, line: int, hook: str) -> None:
    assert found(template.format(hook=hook, clip=clip, k=4)) == [("AG138", line, "error")]


@pytest.mark.parametrize("hook", ["configure_gradient_clipping", "on_before_optimizer_step"])
@pytest.mark.parametrize(("template", "clip", "line"), _LIT_CASES)
def test_clip_once_per_optimizer_step_is_silent(template: str, clip: str, line: int, hook: str) -> None:
    assert found(template.format(hook=hook, clip=clip, k=4)) == []


@pytest.mark.parametrize(("template", "clip", "line"), _LIT_CASES)
def test_clip_in_backward_hook_without_accumulation_is_silent(template: str, clip: str, line: int) -> None:
    assert found(template.format(hook="on_after_backward", clip=clip, k=1)) == []


# ---------------------------------------------------------------- 4. DeepSpeed hand gating, config unseen

_DS_INNER = """
import argparse
import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--accum", type=int, default=4)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
for step in range(100):
    {loop}
"""
_DS_INNER_BUG = """for k in range(args.accum):
        x, y = next(data)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y) / args.accum)
    engine.step()"""
_DS_INNER_OK = """x, y = next(data)
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()"""

_DS_MOD = """
import deepspeed

GRAD_ACC = 8
engine, _, _, _ = deepspeed.initialize(config=args.deepspeed_config, model=model,
                                       model_parameters=model.parameters())
for i, batch in enumerate(loader):
    loss = engine(batch).loss
    {loop}
"""
_DS_MOD_BUG = """engine.backward(loss / GRAD_ACC)
    if (i + 1) % GRAD_ACC == 0:
        engine.step()"""
_DS_MOD_OK = """engine.backward(loss)
    engine.step()"""

_DS_CLASS = """
import deepspeed

class DSTrainer:
    def __init__(self, model, opts):
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config=opts.ds_config)
        self.k = opts.accum
        self.micro = 0

    def train_epoch(self, loader):
        for x, y in loader:
            {loop}
"""
_DS_CLASS_BUG = """self.engine.backward(self.engine(x, y) / self.k)
            self.micro += 1
            if self.micro % self.k == 0:
                self.engine.step()"""
_DS_CLASS_OK = """self.engine.backward(self.engine(x, y))
            self.engine.step()"""

_DS_CASES = [(_DS_INNER, _DS_INNER_BUG, _DS_INNER_OK, 15), (_DS_MOD, _DS_MOD_BUG, _DS_MOD_OK, 11),
             (_DS_CLASS, _DS_CLASS_BUG, _DS_CLASS_OK, 16)]


@pytest.mark.parametrize(("template", "bug", "ok", "line"), _DS_CASES)
def test_deepspeed_hand_gated_with_config_unseen_warns(template: str, bug: str, ok: str, line: int) -> None:
    assert found(template.format(loop=bug)) == [("AG139", line, "warning")]


@pytest.mark.parametrize(("template", "bug", "ok", "line"), _DS_CASES)
def test_deepspeed_engine_gated_is_silent(template: str, bug: str, ok: str, line: int) -> None:
    assert found(template.format(loop=ok)) == []


def test_deepspeed_hand_gated_with_config_in_sight_keeps_its_verdict() -> None:
    src = _DS_MOD.replace("config=args.deepspeed_config", "config=ds_config").replace(
        "GRAD_ACC = 8", 'GRAD_ACC = 8\nds_config = {{"train_micro_batch_size_per_gpu": 4, '
        '"gradient_accumulation_steps": GRAD_ACC, "gradient_clipping": 1.0}}')
    assert [c for c, _, _ in found(src.format(loop=_DS_MOD_BUG))] == ["AG110"]


# ---------------------------------------------------------------- 5. F9: DeepSpeed's default clipping, config file

_NAMES_JSON = {
    "initialize": """
import deepspeed
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config="ds.json")
for x in loader:
    engine.backward(engine(x))
    engine.step()
""",
    "argparse": """
import argparse
import deepspeed
parser = argparse.ArgumentParser()
parser.add_argument("--ds_config", default="ds.json")
args = parser.parse_args()
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=args.ds_config)
for x in loader:
    engine.backward(engine(x))
    engine.step()
""",
    "config_path": """
import deepspeed
DS_CONFIG = "ds.json"
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=DS_CONFIG)
for x in loader:
    engine.backward(engine(x))
    engine.step()
""",
}


def _lint_with_json(tmp_path: Path, script: str, cfg: dict[str, object]) -> list[tuple[str, str]]:
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    (tmp_path / "train.py").write_text(textwrap.dedent(script))
    return [(f.code or "", f.severity.value) for f in lint_file(tmp_path / "train.py")]


_CFG = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
        "zero_optimization": {"stage": 3}}


@pytest.mark.parametrize("spelling", sorted(_NAMES_JSON))
def test_named_config_file_without_gradient_clipping_warns_f9(tmp_path: Path, spelling: str) -> None:
    assert _lint_with_json(tmp_path, _NAMES_JSON[spelling], _CFG) == [("AG203", "warning")]


@pytest.mark.parametrize("clip", [0.0, 1.0])
@pytest.mark.parametrize("spelling", sorted(_NAMES_JSON))
def test_named_config_file_with_gradient_clipping_is_silent(tmp_path: Path, spelling: str, clip: float) -> None:
    assert _lint_with_json(tmp_path, _NAMES_JSON[spelling], {**_CFG, "gradient_clipping": clip}) == []


def test_config_file_handed_to_the_hf_trainer_is_silent(tmp_path: Path) -> None:
    script = """
    from transformers import Trainer, TrainingArguments
    args = TrainingArguments(output_dir="out", deepspeed="ds.json", gradient_accumulation_steps=8)
    Trainer(model=model, args=args, train_dataset=ds).train()
    """
    assert _lint_with_json(tmp_path, script, _CFG) == []


_DATACLASS = """
import dataclasses
from dataclasses import asdict, dataclass, field
import deepspeed

@dataclass
class DSConfig:
    train_micro_batch_size_per_gpu: int = 4
    gradient_accumulation_steps: int = 1
    zero_optimization: dict = field(default_factory=lambda: {{"stage": 3}})
    {clip_field}

engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config={as_dict}(DSConfig({kwargs})))
for x in loader:
    engine.backward(engine(x))
    engine.step()
"""


@pytest.mark.parametrize(("as_dict", "kwargs"), [("asdict", ""), ("dataclasses.asdict", "gradient_accumulation_steps=1")])
def test_dataclass_config_without_gradient_clipping_warns_f9(as_dict: str, kwargs: str) -> None:
    src = _DATACLASS.format(clip_field="", as_dict=as_dict, kwargs=kwargs)
    assert found(src) == [("AG203", 14, "warning")]


@pytest.mark.parametrize(("clip_field", "kwargs"), [("gradient_clipping: float = 0.0", ""),
                                                    ("", "gradient_clipping=1.0")])
def test_dataclass_config_with_gradient_clipping_is_silent(clip_field: str, kwargs: str) -> None:
    assert found(_DATACLASS.format(clip_field=clip_field, as_dict="asdict", kwargs=kwargs)) == []
