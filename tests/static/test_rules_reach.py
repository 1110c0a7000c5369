"""Statically decidable classes lint used to miss, each in several spellings, against correct
twins: a step / clear / clip / scheduler step in a helper (or a helper of a helper) the window
runs on every micro-step; a function handed to another function that runs it per micro-batch;
a loop averaging over its own micro-batches; K read through a boundary flag; wrapper classes
around the optimizer; unprepared Accelerate schedulers; Trainer.training_step overrides; a
helper returning the loss over W; timm's step_update. DeepSpeed and Trainer configs read
through names are in test_rules_configs_read.py."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source


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
    assert not errors(src.format(k=3))  # a warning below the bound (K >= 4)


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
