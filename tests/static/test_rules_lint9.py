"""Statically decidable classes lint used to miss, each in several spellings, against correct
twins: a step / clear / clip / scheduler step in a helper (or a helper of a helper) the window
runs on every micro-step; a function handed to another function that runs it per micro-batch;
a DeepSpeed config whose values are evident but spelled through names (nested dataclasses,
``asdict(cfg)``, ``{**base}`` / ``dict(**base)`` merges, ``.update()`` calls, a builder that
returns the name it filled)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from accumguard.static.lint import lint_file, lint_source


def errors(src: str) -> set[tuple[str, str]]:
    """(code, class) of each error finding."""
    return {(f.code or "", str(f.failure_class)) for f in lint_source(textwrap.dedent(src))
            if f.severity.value == "error"}


def codes(src: str) -> set[str]:
    return {code for code, _ in errors(src)}


# ---------------------------------------------------------------- 1. helpers calling helpers

_STEP_CHAIN = """
import torch

class Runner:
    def __init__(self, model, opt, accumulation=8):
        self.model, self.opt, self.accumulation = model, opt, accumulation

    def _apply(self):
        self.opt.step()
        self.opt.zero_grad()

    def _update(self):
        {clip}
        self._apply()

    def run(self, batches):
        for n, (x, y) in enumerate(batches, start=1):
            loss = torch.nn.functional.mse_loss(self.model(x), y) / self.accumulation
            loss.backward()
            {call}
"""

_CLEAR_CHAIN = """
import torch

ACCUM = 4

def _clear(model):
    model.zero_grad(set_to_none=True)

def reset_state(model, stats):
    stats.clear()
    _clear(model)

def train(model, loader, opt, stats):
    for i, (x, y) in enumerate(loader):
        {before}
        (model(x, y) / ACCUM).backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
            {after}
"""

_CLIP_CHAIN = """
import torch

class Fit:
    def __init__(self, model, opt, accum_steps=4):
        self.model, self.opt, self.accum_steps = model, opt, accum_steps

    def _clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

    def _post_backward(self):
        self._clip()

    def fit(self, loader):
        for i, (x, y) in enumerate(loader):
            (self.model(x, y) / self.accum_steps).backward()
            {pre}
            if (i + 1) % self.accum_steps == 0:
                {at}
                self.opt.step()
                self.opt.zero_grad()
"""

_SCHED_CHAIN = """
import torch

grad_accumulation_steps = 4

def bump_lr(sched):
    sched.step()

def on_window_end(sched, logs):
    logs.append(sched.get_last_lr()[0])
    bump_lr(sched)

def train(model, loader, opt, sched, logs):
    for i, (x, y) in enumerate(loader):
        (model(x, y) / grad_accumulation_steps).backward()
        if (i + 1) % grad_accumulation_steps == 0:
            opt.step()
            opt.zero_grad()
            {at}
        {each}
"""


@pytest.mark.parametrize(("src", "code"), [
    (_STEP_CHAIN.format(clip="pass", call="self._update()"), "AG101"),
    (_STEP_CHAIN.format(clip="pass", call="self._apply()"), "AG101"),
    (_CLEAR_CHAIN.format(before="reset_state(model, stats)", after="pass"), "AG102"),
    (_CLEAR_CHAIN.format(before="pass", after="pass\n        reset_state(model, stats)"), "AG102"),
    (_CLIP_CHAIN.format(pre="self._post_backward()", at="pass"), "AG105"),
    (_SCHED_CHAIN.format(at="pass", each="on_window_end(sched, logs)"), "AG103"),
    (_SCHED_CHAIN.format(at="pass", each="bump_lr(sched)"), "AG103"),
], ids=["step-2-deep", "step-1-deep", "clear-2-deep", "clear-after-if", "clip-2-deep", "sched-2-deep",
        "sched-1-deep"])
def test_a_boundary_call_helpers_deep_runs_every_micro_step(src: str, code: str) -> None:
    assert code in codes(src), lint_source(textwrap.dedent(src))


@pytest.mark.parametrize("src", [
    _STEP_CHAIN.format(clip="pass", call="if n % self.accumulation == 0:\n                self._update()"),
    _STEP_CHAIN.format(clip="torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)",
                       call="if n % self.accumulation == 0:\n                self._update()"),
    _CLEAR_CHAIN.format(before="pass", after="reset_state(model, stats)"),
    _CLIP_CHAIN.format(pre="pass", at="self._post_backward()"),
    _SCHED_CHAIN.format(at="on_window_end(sched, logs)", each="pass"),
], ids=["step-guarded-call", "step-and-clip-guarded", "clear-at-boundary", "clip-at-boundary",
        "sched-at-boundary"])
def test_the_same_helpers_called_at_the_boundary_are_silent(src: str) -> None:
    assert not errors(src), lint_source(textwrap.dedent(src))


def test_a_helper_guarded_inside_itself_is_at_the_boundary() -> None:
    src = """
    import torch

    class T:
        def __init__(self, opt, k=4):
            self.opt, self.k, self.n = opt, k, 0

        def _maybe_step(self):
            self.n += 1
            if self.n % self.k == 0:
                self._really_step()

        def _really_step(self):
            self.opt.step()
            self.opt.zero_grad()

        def loop(self, model, loader):
            for x in loader:
                (model(x).mean() / self.k).backward()
                self._maybe_step()
    """
    assert not errors(src)


# ---------------------------------------------------------------- 2. a function handed over

_PASSED = """
import functools
import torch

grad_accum = 4

def run_epoch(fn, loader):
    for i, batch in enumerate(loader):
        fn(i, batch)

class MiniTrainer:
    def __init__(self, loader):
        self.loader = loader

    def fit(self, body):
        for i, batch in enumerate(self.loader):
            body(i, batch)

def main(model, loader, opt):
    def step_fn(i, batch):
        loss = model(batch).mean() / grad_accum
        loss.backward()
        {gate}opt.step()
        {gate}opt.zero_grad()

    {handover}
"""


@pytest.mark.parametrize("handover", [
    "run_epoch(step_fn, loader)",
    "run_epoch(fn=step_fn, loader=loader)",
    "run_epoch(functools.partial(step_fn), loader)",
    "MiniTrainer(loader).fit(step_fn)",
])
def test_a_function_handed_to_a_loop_of_the_file_is_a_window(handover: str) -> None:
    bug = _PASSED.format(gate="", handover=handover)
    assert "AG101" in codes(bug), lint_source(textwrap.dedent(bug))
    ok = _PASSED.format(gate="if (i + 1) % grad_accum == 0: ", handover=handover)
    assert not errors(ok), lint_source(textwrap.dedent(ok))


def test_a_function_handed_to_an_unknown_trainer_is_not_guessed() -> None:
    src = _PASSED.format(gate="", handover="import lightning\n    lightning.Fabric().launch(step_fn)")
    assert not errors(src)


# ---------------------------------------------------------------- 3. DeepSpeed configs through names

_DS_LOOP = """
import deepspeed
import torch
from dataclasses import asdict, dataclass, field

{config}

def train(model, loader, accum=8):
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={arg})
    for i, (x, y) in enumerate(loader):
        engine.backward(torch.nn.functional.mse_loss(engine(x), y) / accum)
        if (i + 1) % accum == 0:
            engine.step()
"""

_NESTED_DC = """
@dataclass
class ZeroCfg:
    stage: int = 2

@dataclass
class DSConfig:
    train_micro_batch_size_per_gpu: int = 4
    gradient_accumulation_steps: int = {ga}
    gradient_clipping: float = 1.0
    zero_optimization: ZeroCfg = field(default_factory=ZeroCfg)
"""

_DC_INSTANCE = """
@dataclass
class DSArgs:
    train_micro_batch_size_per_gpu: int = 2
    gradient_accumulation_steps: int = 4
    gradient_clipping: float = 1.0
    zero_optimization: dict = None

cfg = DSArgs(gradient_accumulation_steps={ga}, zero_optimization={{"stage": 2}})
"""

_MERGE_FUNC = """
BASE = {{"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0}}

def build_ds_config():
    zero = {{"stage": 1}}
    return dict(**BASE, gradient_accumulation_steps={ga}, zero_optimization=zero)
"""

_MERGE_LITERAL = """
BASE = {{"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "zero_optimization": {{"stage": 2}}}}
ds_config = {{**BASE, "gradient_accumulation_steps": {ga}}}
"""

_UPDATE_MODULE = """
ds_cfg = {{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0}}
ds_cfg.update({{"gradient_accumulation_steps": {ga}, "zero_optimization": {{"stage": 1}}}})
"""

_UPDATE_BUILDER = """
def make_config(micro_bs):
    cfg = {{"train_micro_batch_size_per_gpu": micro_bs, "gradient_clipping": 1.0}}
    cfg["zero_optimization"] = {{"stage": 2}}
    cfg.update(gradient_accumulation_steps={ga})
    return cfg
"""

_SPELLINGS = [
    (_NESTED_DC, "asdict(DSConfig())"),
    (_DC_INSTANCE, "asdict(cfg)"),
    (_MERGE_FUNC, "build_ds_config()"),
    (_MERGE_LITERAL, "ds_config"),
    (_UPDATE_MODULE, "ds_cfg"),
    (_UPDATE_BUILDER, "make_config(8)"),
]
_IDS = ["nested-dataclass", "dataclass-instance", "dict-merge-builder", "spread-literal", "update-module",
        "update-builder"]


@pytest.mark.parametrize(("config", "arg"), _SPELLINGS, ids=_IDS)
def test_a_config_spelled_through_names_is_read(config: str, arg: str) -> None:
    ga1 = _DS_LOOP.format(config=config.format(ga=1), arg=arg)
    assert ("AG109", "F2") in errors(ga1), lint_source(textwrap.dedent(ga1))
    ga8 = _DS_LOOP.format(config=config.format(ga=8), arg=arg)
    assert ("AG110", "F14") in errors(ga8), lint_source(textwrap.dedent(ga8))


@pytest.mark.parametrize(("config", "arg"), _SPELLINGS, ids=_IDS)
def test_the_engine_loop_with_those_configs_is_silent(config: str, arg: str) -> None:
    src = _DS_LOOP.format(config=config.format(ga=8), arg=arg).replace(
        "        if (i + 1) % accum == 0:\n            engine.step()", "        engine.step()").replace(
        "/ accum)", ")")
    assert not errors(src), lint_source(textwrap.dedent(src))


def test_an_update_that_may_not_run_leaves_the_config_partial() -> None:
    config = """
ds_cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
import os
if os.environ.get("BIG"):
    ds_cfg.update(gradient_accumulation_steps=8)
"""
    src = _DS_LOOP.format(config=config, arg="ds_cfg")
    # GA is 1 or 8 depending on the environment: no AG109/AG110 error on a guess
    assert not {"AG109", "AG110"} & codes(src), lint_source(textwrap.dedent(src))


# ---------------------------------------------------------------- 4. a loop averaging over its own micro-batches

_GROUPED = """
import itertools
import torch

def batched(it, n):
    it = iter(it)
    while chunk := list(itertools.islice(it, n)):
        yield chunk

def train(model, loader, opt, sched):
    for group in batched(loader, 4):
        for x, y in group:
            loss = torch.nn.functional.mse_loss(model(x), y) / {count}
            loss.backward()
            {inner}
        opt.step()
        {outer}
        opt.zero_grad()
"""


@pytest.mark.parametrize("count", ["len(group)"])
def test_a_loop_that_divides_by_its_own_length_is_a_window(count: str) -> None:
    bug = _GROUPED.format(count=count, inner="sched.step()", outer="pass")
    assert ("AG103", "F4") in errors(bug), lint_source(textwrap.dedent(bug))
    ok = _GROUPED.format(count=count, inner="pass", outer="sched.step()")
    assert not errors(ok)


def test_a_range_loop_divided_by_its_bound_is_a_window() -> None:
    src = """
    import torch

    def train(model, it, opt, n):
        for step in range(100):
            for _ in range(n):
                (model(next(it)).mean() / n).backward()
                opt.zero_grad()
            opt.step()
    """
    assert ("AG102", "F3") in errors(src)


def test_a_multi_task_sum_is_not_made_a_window_by_this() -> None:
    src = """
    import torch

    def train(model, tasks, loader, opt):
        for batch in loader:
            for task in tasks:
                model(batch, task).loss.backward()
            opt.step()
            opt.zero_grad()
    """
    assert not errors(src)


# ---------------------------------------------------------------- 5. K read through a boundary flag (F12)

def test_fsdp2_low_precision_reduce_reads_k_through_a_flag() -> None:
    src = """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ACCUM_STEPS = {k}

    def train(model, loader, opt):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        fully_shard(model, mp_policy=mp)
        for i, (x, y) in enumerate(loader):
            is_last = (i + 1) % ACCUM_STEPS == 0
            model.set_requires_gradient_sync(is_last)
            (model(x, y) / ACCUM_STEPS).backward()
            if is_last:
                opt.step()
                opt.zero_grad()
    """
    assert ("AG126", "F12") in errors(src.format(k=512))
    assert not errors(src.format(k=8))  # a warning below the bound


def test_a_bf16_model_reads_k_through_a_flag() -> None:
    src = """
    import torch

    K = 256

    def train(model, loader):
        model = model.to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters())
        for i, (x, y) in enumerate(loader):
            ready = (i + 1) % K == 0
            (model(x, y) / K).backward()
            if ready:
                opt.step()
                opt.zero_grad()
    """
    assert ("AG120", "F12") in errors(src)


# ---------------------------------------------------------------- 6. HF TrainingArguments(**kwargs)

_HF = """
from torch import nn
from transformers import Trainer, TrainingArguments

training_kwargs = {spec}

class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        out = model(input_ids=inputs["input_ids"])
        loss = nn.functional.cross_entropy(out.logits.flatten(0, 1), inputs["labels"].flatten())
        return (loss, out) if return_outputs else loss

def main(model, ds):
    T(model=model, args=TrainingArguments(**training_kwargs), train_dataset=ds).train()
"""


@pytest.mark.parametrize(("spec", "severity"), [
    ('dict(output_dir="o", gradient_accumulation_steps=16)', "error"),
    ('{"output_dir": "o", "gradient_accumulation_steps": 16}', "error"),
    ('{"output_dir": "o"}', None),  # GA 1: the micro-batch is the batch
    ('dict(output_dir="o", gradient_accumulation_steps=1)', None),
    ('load_kwargs()', "warning"),  # out of sight
])
def test_trainer_arguments_spread_from_a_dict_of_the_file(spec: str, severity: str | None) -> None:
    src = textwrap.dedent(_HF.format(spec=spec))
    got = {f.severity.value for f in lint_source(src) if f.code == "AG118"}
    assert got == ({severity} if severity else set()), lint_source(src)


# ---------------------------------------------------------------- 7. a config handed over through copies and builders

_COPY = """
import copy
BASE_CONFIG = {{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4,
                "gradient_clipping": 1.0, "zero_optimization": {{"stage": 2}}}}
config = copy.deepcopy(BASE_CONFIG)
config["gradient_accumulation_steps"] = {ga}
"""

_TO_DICT = """
@dataclass
class Zero:
    stage: int = 1

@dataclass
class Cfg:
    train_micro_batch_size_per_gpu: int = 4
    gradient_accumulation_steps: int = {ga}
    gradient_clipping: float = 1.0
    zero_optimization: Zero = field(default_factory=Zero)

    def to_dict(self):
        return asdict(self)

cfg = Cfg()
"""

_SPREADS_ONLY = """
batch = {{"train_batch_size": {tbs}, "train_micro_batch_size_per_gpu": 32}}
zero2 = {{"zero_optimization": {{"stage": 2}}, "gradient_clipping": 1.0}}
ds_config = {{**batch, **zero2}}
"""

_BUILDER_COPY = """
import copy
BASE = {{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0, "zero_optimization": {{"stage": 1}}}}

def make():
    c = BASE.copy()
    c["gradient_accumulation_steps"] = {ga}
    return c
"""

_SPELLINGS2 = [
    (_COPY.format(ga=1), _COPY.format(ga=8), "config"),
    (_TO_DICT.format(ga=1), _TO_DICT.format(ga=8), "cfg.to_dict()"),
    (_SPREADS_ONLY.format(tbs=32), _SPREADS_ONLY.format(tbs=256), "ds_config"),
    (_BUILDER_COPY.format(ga=1), _BUILDER_COPY.format(ga=8), "make()"),
]


@pytest.mark.parametrize(("ga1", "ga8", "arg"), _SPELLINGS2, ids=["deepcopy-then-key", "dataclass-to-dict",
                                                                   "spreads-only", "builder-copy"])
def test_a_config_built_from_copies_and_builders_is_read(ga1: str, ga8: str, arg: str) -> None:
    bug = _DS_LOOP.format(config=ga1, arg=arg)
    assert ("AG109", "F2") in errors(bug), lint_source(textwrap.dedent(bug))
    ok = _DS_LOOP.format(config=ga8, arg=arg).replace(
        "        if (i + 1) % accum == 0:\n            engine.step()", "        engine.step()").replace("/ accum)", ")")
    if arg != "ds_config":  # 256 / 32: GA 8 only with one rank; the engine loop is right for any GA
        assert not errors(ok), lint_source(textwrap.dedent(ok))


def test_a_key_written_under_a_condition_is_unknown() -> None:
    config = """
import copy, os
BASE = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
config = copy.deepcopy(BASE)
if os.environ.get("ACCUM"):
    config["gradient_accumulation_steps"] = 8
"""
    src = _DS_LOOP.format(config=config, arg="config")
    assert not {"AG109", "AG110"} & codes(src), lint_source(textwrap.dedent(src))


# ---------------------------------------------------------------- 8. a wrapper class of the file around the optimizer

_WRAPPER = """
import torch

class {name}{bases}:
    def __init__(self, optimizer, accumulative_counts=4):
        self.optimizer = optimizer
        self.accumulative_counts = accumulative_counts
        self._inner = 0

    def step(self):
        self._inner += 1
        {gate}self.optimizer.step()
        {gate}self.optimizer.zero_grad()

def train(model, loader):
    optim_wrapper = {name}(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=4)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y) / optim_wrapper.accumulative_counts
        loss.backward()
        optim_wrapper.step()
"""


def test_a_wrapper_that_gates_its_own_step_is_followed() -> None:
    ok = _WRAPPER.format(name="AccumulatingOptimizer", bases="",
                         gate="if self._inner % self.accumulative_counts == 0: ")
    assert not errors(ok), lint_source(textwrap.dedent(ok))
    bug = _WRAPPER.format(name="AccumulatingOptimizer", bases="", gate="")
    assert ("AG101", "F1") in errors(bug), lint_source(textwrap.dedent(bug))


def test_a_custom_optimizer_subclass_is_still_an_optimizer() -> None:
    src = _WRAPPER.format(name="MyOptim", bases="(torch.optim.Optimizer)", gate="")
    assert ("AG101", "F1") in errors(src), lint_source(textwrap.dedent(src))


# ---------------------------------------------------------------- 9. Accelerate: a scheduler never prepared

_ACC = """
import torch
from accelerate import Accelerator

def main(model, loader):
    accelerator = Accelerator(gradient_accumulation_steps={k})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)
    model, optimizer, loader{prepared} = accelerator.prepare(model, optimizer, loader{prepared})
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            {gate}scheduler.step()
            optimizer.zero_grad()
"""


def test_an_unprepared_scheduler_steps_every_micro_batch_under_accumulate() -> None:
    bug = _ACC.format(k=8, prepared="", gate="")
    assert ("AG103", "F4") in errors(bug), lint_source(textwrap.dedent(bug))


@pytest.mark.parametrize(("k", "prepared", "gate"), [
    (8, ", scheduler", ""),  # prepared: Accelerate gates it
    (8, "", "if accelerator.sync_gradients: "),
    (1, "", ""),  # no accumulation
])
def test_a_prepared_or_gated_scheduler_is_silent(k: int, prepared: str, gate: str) -> None:
    src = _ACC.format(k=k, prepared=prepared, gate=gate)
    assert not errors(src), lint_source(textwrap.dedent(src))


# ---------------------------------------------------------------- 10. HF Trainer.training_step override

_HF_STEP = """
from transformers import Trainer, TrainingArguments

class StepTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        self.accelerator.backward(loss)
        {body}
        return loss.detach()

def main(model, ds):
    args = TrainingArguments(output_dir="x", gradient_accumulation_steps={k})
    StepTrainer(model=model, args=args, train_dataset=ds).train()
"""


def test_a_trainer_training_step_that_steps_the_optimizer_is_f1_with_ga() -> None:
    body = "self.optimizer.step()\n        self.optimizer.zero_grad()"
    bug = _HF_STEP.format(body=body, k=4)
    assert ("AG101", "F1") in errors(bug), lint_source(textwrap.dedent(bug))
    assert not errors(_HF_STEP.format(body=body, k=1))
    assert not errors(_HF_STEP.format(body="pass", k=4))


# ---------------------------------------------------------------- 11. a config in sight whose GA and stage are passed in

_PASSED_IN = """
import deepspeed

def _ds_config(stage, ga):
    cfg = {{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ga,
           "zero_optimization": {{"stage": stage}}, "gradient_clipping": 1.0}}
    return cfg

def run(model, data, stage, ga, k):
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=_ds_config(stage, ga))
    for start in range(0, len(data), k):
        for batch in data[start:start + k]:
            engine.backward({loss})
        engine.step()
"""


def test_a_config_whose_ga_and_stage_are_passed_in_is_judged_as_out_of_sight() -> None:
    divided = textwrap.dedent(_PASSED_IN.format(loss="engine(batch).mean() / k"))
    assert {(f.code, f.severity.value) for f in lint_source(divided) if f.code in ("AG109", "AG110", "AG139")} \
        == {("AG139", "warning")}, lint_source(divided)


# ---------------------------------------------------------------- 12. loss / W returned by a helper

_DDP_HELPER = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 4

def compute_loss(model, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    {ret}

def train(model, loader):
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        loss = compute_loss(model, x, y) / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
"""


@pytest.mark.parametrize("ret", ["return loss / dist.get_world_size()",
                                 "loss = loss / dist.get_world_size()\n    return loss"])
def test_a_helper_returning_the_loss_over_w_under_ddp(ret: str) -> None:
    bug = _DDP_HELPER.format(ret=ret)
    assert ("AG112", "F10") in errors(bug), lint_source(textwrap.dedent(bug))


def test_a_helper_dividing_a_logged_copy_by_w_is_silent() -> None:
    src = _DDP_HELPER.format(ret="return loss").replace(
        "        loss.backward()", "        loss.backward()\n        shown = compute_mean(loss.detach())") + """
def compute_mean(loss):
    dist.all_reduce(loss)
    return loss / dist.get_world_size()
"""
    assert not errors(src), lint_source(textwrap.dedent(src))


def test_a_non_deepspeed_config_keyword_is_not_read_as_a_deepspeed_config() -> None:
    src = """
    import copy
    from mylib import Runner

    BASE = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2}

    def main(model, loader, opt):
        cfg = copy.deepcopy(BASE)
        Runner(model, config=cfg).fit(loader)
        for i, x in enumerate(loader):
            model(x).mean().backward()
            opt.step()
            opt.zero_grad()
    """
    assert not [f for f in lint_source(textwrap.dedent(src)) if (f.code or "").startswith("AG2")]


# ---------------------------------------------------------------- 13. f-string paths beside the script, pydantic configs

def test_a_json_config_named_by_an_fstring_beside_the_script(tmp_path: Path) -> None:
    (tmp_path / "ds_zero2.json").write_text(
        '{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,'
        ' "zero_optimization": {"stage": 2}}')
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_DS_LOOP.format(config="import os\nHERE = os.path.dirname(__file__)",
                                                      arg='f"{HERE}/ds_zero2.json"')))
    assert ("AG109", "F2") in {(f.code, str(f.failure_class)) for f in lint_file(script)
                               if f.severity.value == "error"}, lint_file(script)


def test_a_pydantic_config_is_read_like_a_dataclass() -> None:
    config = """
from pydantic import BaseModel, Field

class Zero(BaseModel):
    stage: int = 1

class DSConfig(BaseModel):
    train_micro_batch_size_per_gpu: int = 4
    gradient_accumulation_steps: int = Field(default={ga})
    gradient_clipping: float = 1.0
    zero_optimization: Zero = Field(default_factory=Zero)

cfg = DSConfig()
"""
    for ga, code in ((1, "AG109"), (8, "AG110")):
        src = _DS_LOOP.format(config=config.format(ga=ga), arg="cfg.model_dump()")
        assert code in codes(src), lint_source(textwrap.dedent(src))


# ---------------------------------------------------------------- 14. a config given by a launcher beside the script

_CLI_SCRIPT = """
import argparse
import deepspeed
import torch

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad_accum", type=int, default=4)
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args()
    model = torch.nn.Linear(4, 4)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    for step in range(3):
        for k in range(args.grad_accum):
            engine.backward(engine(torch.randn(2, 4)).mean() / args.grad_accum)
        engine.step()
"""


def _cli_case(tmp_path: Path, launchers: dict[str, str], configs: dict[str, int]) -> set[tuple[str, str]]:
    for name, ga in configs.items():
        (tmp_path / name).write_text(
            f'{{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": {ga}, '
            '"gradient_clipping": 1.0, "zero_optimization": {"stage": 2}}')
    for name, text in launchers.items():
        (tmp_path / name).write_text(text)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_CLI_SCRIPT))
    return {(f.code or "", f.severity.value) for f in lint_file(script)}


def test_a_config_given_by_a_launcher_beside_the_script_is_read(tmp_path: Path) -> None:
    got = _cli_case(tmp_path, {"run.sh": "deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json\n"},
                    {"ds.json": 1})
    assert ("AG109", "error") in got, got


def test_launchers_that_disagree_leave_the_config_out_of_sight(tmp_path: Path) -> None:
    got = _cli_case(tmp_path, {"run.sh": "deepspeed train.py --deepspeed_config ds1.json\n",
                               "big.sh": "deepspeed train.py --deepspeed_config=ds8.json\n"},
                    {"ds1.json": 1, "ds8.json": 8})
    assert not {c for c, sev in got if sev == "error"}, got
    assert ("AG139", "warning") in got, got


def test_a_launcher_line_of_another_script_is_not_read(tmp_path: Path) -> None:
    got = _cli_case(tmp_path, {"run.sh": "deepspeed other_train.py --deepspeed_config ds.json\n"}, {"ds.json": 1})
    assert ("AG109", "error") not in got, got


# ---------------------------------------------------------------- 15. timm's step_update given the micro-batch counter

_TIMM = """
import torch

def train_one_epoch(epoch, model, loader, optimizer, lr_scheduler, accum_steps=4):
    num_updates = epoch * (len(loader) // accum_steps)
    for batch_idx, (x, y) in enumerate(loader):
        need_update = (batch_idx + 1) % accum_steps == 0
        (torch.nn.functional.cross_entropy(model(x), y) / accum_steps).backward()
        if need_update:
            optimizer.step()
            optimizer.zero_grad()
            num_updates += 1
        {call}
"""


def test_timm_step_update_with_the_micro_batch_counter_is_f4() -> None:
    bug = _TIMM.format(call="lr_scheduler.step_update(num_updates=batch_idx)")
    assert ("AG103", "F4") in errors(bug), lint_source(textwrap.dedent(bug))
    for call in ("lr_scheduler.step_update(num_updates=num_updates)",
                 "lr_scheduler.step_update(num_updates)"):
        ok = _TIMM.format(call=call)
        assert not errors(ok), lint_source(textwrap.dedent(ok))
