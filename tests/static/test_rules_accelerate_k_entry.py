"""AG121's window-count form knows the Accelerator's K when the script hands it a config
entry (``Accelerator(gradient_accumulation_steps=HP["K"])``): a loss scaled by
``W * HP["K"] / n_win`` undoes ``accelerator.backward``'s /K and is right (blind round 49,
a_c02); the same loss without the K is divided twice."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_SRC = """
import torch
from accelerate import Accelerator

HP = dict(K=3, windows=4)


def main():
    acc = Accelerator(gradient_accumulation_steps=HP["K"])
    W = acc.num_processes
    model, opt = acc.prepare(model_fn(), opt_fn())
    for w in range(HP["windows"]):
        batches = [batch_of(w, i) for i in range(HP["K"])]
        n_local = sum(int((b[1] != -100).sum()) for b in batches)
        n_win = acc.gather(torch.tensor([n_local])).sum().item()
        for ids, lab in batches:
            with acc.accumulate(model):
                s = ce_sum(model, ids, lab)
                acc.backward(s * ({scale} / n_win))
                opt.step()
                opt.zero_grad()
"""


@pytest.mark.parametrize(("scale", "expected"), [
    ('W * HP["K"]', []),
    ("W", ["AG121"]),
])
def test_the_accelerator_s_k_as_a_config_entry(scale: str, expected: list[str]) -> None:
    found = [f.code for f in lint_source(textwrap.dedent(_SRC.format(scale=scale)))
             if f.code == "AG121"]
    assert found == expected


def test_a_sum_over_the_gathered_window_count_is_no_mean_of_means() -> None:
    # (`.ne(-100).sum()` counts tokens as `!= -100` does; AG104 read the gathered window
    # count as no normaliser and warned "a mean over a variable number of tokens")
    src = textwrap.dedent(_SRC.format(scale='W * HP["K"]')).replace(
        "(b[1] != -100).sum()", "b[1].ne(-100).sum()")
    found = [f.code for f in lint_source(src) if f.code in ("AG104", "AG121")]
    assert found == []
