"""Shapes from blind round 67 (lint):

- a hand-written gradient all-reduce helper whose division by the world size sits under
  ``if average:``, called with ``average=False`` everywhere: no average is made, so a loss
  over a count summed over the ranks is right (67 b_b02_fixed; AG123 was a false error);
- a learning rate written by hand from ``global_step = epoch * len(loader) + i`` (the flat
  window's index: a count of micro-batches) with a horizon divided by K (67 c_b03, AG130);
- an Accelerate-prepared scheduler whose horizon is a config entry counting optimizer steps
  (``U = CONFIG["updates"]``) in a file written for several processes (67 a_b03, AG125)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source


def _codes(src: str) -> dict[str, str]:
    return {f.code: f.severity.value for f in lint_source(textwrap.dedent(src))}


_HAND_REDUCE = """
import torch
import torch.distributed as dist
import torch.nn.functional as F


def allreduce_grads(model, average):
    grads = [p.grad for p in model.parameters()]
    bucket = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(bucket, op=dist.ReduceOp.SUM)
    if average:
        bucket /= dist.get_world_size()
    torch.nn.utils.vector_to_parameters(bucket, grads)


def global_count(n):
    t = torch.tensor(float(n))
    dist.all_reduce(t)
    return t


def train(model, opt, windows):
    for window in windows:
        denom = global_count(sum(len(yb) for _, yb in window))
        for xb, yb in window:
            loss = F.cross_entropy(model(xb), yb, reduction="sum") / denom
            loss.backward()
        allreduce_grads(model, average=FLAG)
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


def test_a_division_by_the_world_switched_off_at_every_call_is_no_average() -> None:
    assert "AG123" not in _codes(_HAND_REDUCE.replace("FLAG", "False"))
    assert _codes(_HAND_REDUCE.replace("FLAG", "True")).get("AG123") == "error"


_LR_BY_HAND = """
import torch


def lr_at(step, cfg, total_steps):
    if step < cfg["warmup"]:
        return cfg["lr"] * (step + 1) / cfg["warmup"]
    return cfg["lr"] * max(0.05, 1 - (step - cfg["warmup"]) / (total_steps - cfg["warmup"]))


def main(cfg, model, loader, opt):
    K = cfg["accum"]
    total_steps = cfg["epochs"] * (len(loader) // K)
    for epoch in range(cfg["epochs"]):
        for i, (xb, yb) in enumerate(loader):
            global_step = COUNTER
            for g in opt.param_groups:
                g["lr"] = lr_at(global_step, cfg, total_steps)
            loss = torch.nn.functional.cross_entropy(model(xb), yb) / K
            loss.backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
"""


def test_a_rate_from_a_global_micro_batch_index_with_a_horizon_over_k() -> None:
    assert _codes(_LR_BY_HAND.replace("COUNTER", "epoch * len(loader) + i")).get("AG130") \
        == "error"
    assert "AG130" not in _codes(_LR_BY_HAND.replace("COUNTER", "(epoch * len(loader) + i) // K"))


_ACCEL = """
import torch
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

CONFIG = {"accum": 4, "batch": 8, "updates": 6, "warmup": 2}


def main(model, ds):
    acc = Accelerator(cpu=True, gradient_accumulation_steps=CONFIG["accum"])
    W, K, U = acc.num_processes, CONFIG["accum"], CONFIG["updates"]
    data = ds[: CONFIG["batch"] * K * W * U]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=CONFIG["warmup"],
                                            num_training_steps=HORIZON)
    loader = torch.utils.data.DataLoader(data, batch_size=CONFIG["batch"])
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    for x, y in loader:
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
"""


def test_an_accelerate_horizon_from_a_config_entry_of_optimizer_steps() -> None:
    assert _codes(_ACCEL.replace("HORIZON", "U")).get("AG125") == "warning"
    assert "AG125" not in _codes(_ACCEL.replace("HORIZON", "U * W"))
