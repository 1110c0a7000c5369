"""DeepSpeed and HF Trainer configs whose values are evident but spelled through names:
nested dataclasses, ``asdict(cfg)``, ``{**base}`` / ``dict(**base)`` merges, ``.update()``
calls, builders returning the name they filled, copies, ``TrainingArguments(**kwargs)``,
pydantic models, f-string JSON paths and launchers beside the script; a config in sight
whose GA and stage are passed in is judged as out of sight."""

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
