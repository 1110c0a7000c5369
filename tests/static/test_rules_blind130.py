"""Shapes from blind round 130 (lint): a backward before the training loop (a throughput
benchmark, a compile warm-up) is an F7 error when it runs through the model the loop trains
(its parameters go to the optimizer), a warning when which parameters it reached is not in
sight (130 c_b03; also 110 c_b02 and 119 a_b03, warnings before)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source


def _ag316(src: str) -> list[str]:
    return [f.severity.value for f in lint_source(textwrap.dedent(src)) if f.code == "AG316"]


_LOOP = """
import torch

def benchmark(net, x, y):
    torch.nn.functional.mse_loss(net(x), y).backward()

student = Student()
teacher = Teacher()
opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
benchmark({probe}, x0, y0)
for step in range(100):
    for micro in range(4):
        x, y = next(batches)
        with torch.no_grad():
            hint = teacher(x)
        (torch.nn.functional.mse_loss(student(x), y + hint) / 4).backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_benchmark_backward_through_the_trained_model_is_an_error() -> None:
    assert _ag316(_LOOP.format(probe="student")) == ["error"]


def test_one_through_a_model_the_optimizer_does_not_hold_is_a_warning() -> None:
    """The teacher is called in the loop too, but its parameters are in no optimizer: its
    gradient from the benchmark never reaches an update."""
    assert _ag316(_LOOP.format(probe="teacher")) == ["warning"]


def test_a_benchmark_cleared_before_the_loop_is_silent() -> None:
    src = _LOOP.format(probe="student").replace("for step in", "opt.zero_grad()\nfor step in")
    assert _ag316(src) == []


_TOKENS = """
import argparse
from transformers import TrainingArguments
ap = argparse.ArgumentParser()
ap.add_argument("--sync-tokens", action="store_true"{default})
args = ap.parse_args()
TrainingArguments(output_dir="o", gradient_accumulation_steps=4,
                  average_tokens_across_devices=args.sync_tokens)
"""


def test_token_averaging_switched_by_an_option_off_by_default_is_f6() -> None:
    """Round 132 b_b03: ``average_tokens_across_devices`` from a ``store_true`` option,
    off unless given (AG140's F6 warning); an explicit ``default=True`` is on: silent."""
    def ag140(default: str) -> list[str]:
        return [f.cls for f in lint_source(textwrap.dedent(_TOKENS.format(default=default)))
                if f.code == "AG140"]
    assert ag140("") == ["F6"]
    assert ag140(", default=False") == ["F6"]
    assert ag140(", default=True") == []


_RANK_COUNT = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

class T:
    def __init__(self, net):
        self.world = dist.get_world_size()
        self.ddp = DDP(net)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.1)

    def count(self, window):
        n_local = torch.tensor(float(sum(len(x) for x, _ in window)))
        n_global = n_local.clone()
        dist.all_reduce(n_global)
        return {ret}

    def step_window(self, window):
        n = self.count(window)
        for x, y in window:
            (({scaled}) / n).backward()
        self.opt.step()
        self.opt.zero_grad()
"""


def test_a_loss_times_the_world_over_the_all_ranks_count_is_no_f10() -> None:
    """Round 132 a_c02 (a false AG123 error on a correct script): `(err * self.world /
    n_all).backward()` scales the loss by W itself; the statement's backward says what the
    world size scales."""
    src = _RANK_COUNT.format(ret="n_global", scaled="(self.ddp(x) - y).pow(2).sum() * self.world")
    assert [f.code for f in lint_source(textwrap.dedent(src)) if f.severity.value == "error"] == []


def test_a_helper_returning_the_local_count_beside_a_reduced_one_is_f6_not_f10() -> None:
    """Round 132 a_b03: the helper all-reduces a copy and returns the rank's own count: not
    "a count summed over every rank" (AG123's F10 said so), the rank-local normalisation."""
    src = _RANK_COUNT.format(ret="n_local", scaled="(self.ddp(x) - y).pow(2).sum()")
    found = {(f.code, f.cls) for f in lint_source(textwrap.dedent(src))}
    assert ("AG123", "F10") not in found and ("AG113", "F6") in found, found
