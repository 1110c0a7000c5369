"""Shapes from blind rounds 59-60 (lint):

- an FSDP2 divide factor on the root only is an error without clipping and a warning with a
  norm clip in the file (clipping that acts rescales the averaged and the summed gradient
  to the same norm: only the gradient is proven off; 60 b_c02);
- a reference loop dividing its loss by a count of its window's data (a slice sized K x W)
  is a whole-window iteration: no F1 for its once-per-iteration step (60 b_c01)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source

_FSDP = """
import torch
from torch.distributed.fsdp import fully_shard

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
model.set_gradient_divide_factor(1.0)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    for k in range(4):
        model.set_requires_gradient_sync(k == 3)
        (loss_sum(model, k) / window_total).backward()
    CLIP
    opt.step()
    opt.zero_grad()
"""


def _severity(src: str, code: str) -> list[str]:
    return [f.severity.value for f in lint_source(textwrap.dedent(src)) if f.code == code]


def test_fsdp2_factor_on_the_root_is_an_error_without_clipping() -> None:
    assert _severity(_FSDP.replace("CLIP", "pass"), "AG156") == ["error"]


def test_fsdp2_factor_on_the_root_is_a_warning_with_a_norm_clip() -> None:
    clip = "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)"
    assert _severity(_FSDP.replace("CLIP", clip), "AG156") == ["warning"]


def test_a_reference_loop_over_window_slices_is_not_micro_steps() -> None:
    src = """
    import torch
    import torch.distributed as dist


    def main(cfg):
        rank = dist.get_rank()
        model = build()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
        for step in range(cfg.steps):
            n_window = window_tokens(step)
            for k in range(cfg.accum):
                ddp.require_backward_grad_sync = k == cfg.accum - 1
                sl = micro_slice(cfg, step, k, rank)
                loss = loss_sum_rows(ddp, ids[sl], labels[sl]) * cfg.world / n_window
                loss.backward()
            opt.step()
            opt.zero_grad()
        if rank == 0:
            ref = build()
            ropt = torch.optim.Adam(ref.parameters(), lr=cfg.lr)
            for step in range(cfg.steps):
                sl = slice(step * cfg.accum * cfg.world * cfg.micro_bs,
                           (step + 1) * cfg.accum * cfg.world * cfg.micro_bs)
                n = (labels[sl] != -100).sum()
                loss = loss_sum_rows(ref, ids[sl], labels[sl]) / n
                ropt.zero_grad()
                loss.backward()
                ropt.step()
    """
    found = [(f.code, f.severity.value) for f in lint_source(textwrap.dedent(src))]
    assert not [c for c, s in found if c in ("AG101", "AG104")], found
