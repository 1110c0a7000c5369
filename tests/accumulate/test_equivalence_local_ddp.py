"""Accumulator on `local` and `ddp` (2 real gloo ranks) vs the single-process reference.

Criterion (mission.md): relative error of the parameter *update* ≤ 1e-5 after
every step, fp32 target vs fp64 reference. Negative checks show the same
comparison fails broken loops by ≥ 1e-2, and collectives are counted.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard import Accumulator
from accumguard.demo.toy import count_tokens, token_loss
from accumguard.engines.ddp import DDPEngine
from accumguard.verify.reference import flat_params

from helpers import (
    BROKEN_MIN_ERROR,
    FP32_UPDATE_TOL,
    Case,
    make_data,
    make_model,
    make_optimizer,
    make_scheduler,
    train_with_accumulator,
    update_errors,
)

# K ∈ {1, 3, 4}; 10 micro-batches per rank leave partial windows for K=3 and K=4;
# uneven tokens everywhere; scheduler, clipping, GradScaler, SGD and AdamW, 'mean' mode.
GRID = [
    Case(accumulation_steps=1, micro_batches=5, optimizer="sgd"),
    Case(accumulation_steps=3, micro_batches=16, optimizer="sgd", scheduler=True),
    Case(accumulation_steps=4, micro_batches=22, optimizer="adamw", max_grad_norm=0.3),
    Case(accumulation_steps=4, micro_batches=20, optimizer="adamw", scheduler=True,
         max_grad_norm=1.0, scaler=True, seed=3),
    Case(accumulation_steps=3, micro_batches=16, optimizer="sgd", vary_batch_size=True,
         seed=4),
    Case(accumulation_steps=4, micro_batches=22, optimizer="sgd", drop_last_window=True,
         seed=5),
    Case(accumulation_steps=4, micro_batches=22, optimizer="sgd", uneven=False,
         normalization="mean", seed=6),
]


def _ddp_grid(rank: int, world: int, cases: list[Case]) -> list:
    out = []
    for case in cases:
        ddp = DDP(make_model(case))
        engine = DDPEngine(ddp, sync=case.sync)
        snaps, colls, acc = train_with_accumulator(case, ddp, engine, make_data(case, world)[rank])
        out.append((snaps, colls, acc.optimizer_steps))
    return out


@pytest.mark.parametrize("case", GRID, ids=lambda c: f"K{c.accumulation_steps}-{c.optimizer}"
                         f"-{c.normalization}-s{c.seed}")
def test_local_matches_reference(case: Case) -> None:
    model = make_model(case)
    snaps, colls, _ = train_with_accumulator(case, model, "local", make_data(case, 1)[0])
    errors = update_errors(case, 1, snaps)
    assert max(errors) <= FP32_UPDATE_TOL, errors
    assert all(c == 0 for c in colls)


DDP_CASES = GRID + [c.with_(sync="eager") for c in GRID[1:3]]
BROKEN_CASE = Case(accumulation_steps=4, micro_batches=8, optimizer="sgd", seed=7)
BUGS = ["step_every_micro_step", "mean_of_means"]
RESUME_CASE = Case(accumulation_steps=3, micro_batches=17, optimizer="adamw", scheduler=True,
                   max_grad_norm=0.5, seed=9)


def _every_ddp_run(rank: int, world: int) -> dict:
    """The grid, the broken loops and the resume of this module in ONE 2-rank spawn (each
    builds its own DDP model; a spawn costs more than all of them on this machine)."""
    return {"grid": _ddp_grid(rank, world, DDP_CASES),
            "broken": {bug: _broken_ddp(rank, world, BROKEN_CASE, bug) for bug in BUGS},
            "resume": _resume(rank, world, RESUME_CASE, 2)}


@pytest.fixture(scope="module")
def ddp_runs(torch_spawn: dict[str, list[Any]]) -> list[dict]:
    """:func:`_every_ddp_run`'s per-rank results, from the torch-only spawn shared with the
    other DDP modules of tests/accumulate (tests/ds_spawn.py)."""
    out: list[dict] = torch_spawn["test_equivalence_local_ddp"]
    return out


@pytest.fixture(scope="module")
def ddp_results(ddp_runs: list[dict]) -> list:
    return list(zip(DDP_CASES, ddp_runs[0]["grid"], strict=True))


def test_ddp_matches_reference_after_every_step(ddp_results: list) -> None:
    worst = 0.0
    for case, (snaps, _, _) in ddp_results:
        errors = update_errors(case, 2, snaps)
        assert max(errors) <= FP32_UPDATE_TOL, (case, errors)
        assert len(snaps) >= 5, (case, len(snaps))
        worst = max(worst, max(errors))
    print(f"max relative update error over the DDP grid: {worst:.2e}")


def test_ddp_deferred_issues_one_all_reduce_round_per_step(ddp_results: list) -> None:
    for case, (_, colls, steps) in ddp_results:
        if case.sync == "deferred":
            assert colls == [1] * steps, (case, colls)


def test_ddp_eager_issues_one_round_per_micro_step(ddp_results: list) -> None:
    eager = [(c, r) for c, r in ddp_results if c.sync == "eager"]
    assert eager
    for case, (_, colls, _) in eager:
        k, m = case.accumulation_steps, case.micro_batches
        expected = [k] * (m // k) + ([m % k] if m % k else [])
        assert colls == expected, (case, colls)


# -- negative checks: the comparison can fail ------------------------------------------------

def _broken_ddp(rank: int, world: int, case: Case, bug: str) -> list:
    """Hand-written DDP loops with one known bug each; returns per-step snapshots."""
    model = DDP(make_model(case))
    opt = make_optimizer(case, model.parameters())
    k = case.accumulation_steps
    data = make_data(case, world)[rank]
    snaps = []
    for start in range(0, len(data), k):
        window = data[start:start + k]
        for i, batch in enumerate(window):
            s, n = token_loss(model, batch)
            if bug == "step_every_micro_step":
                (s / n).backward()
                opt.step()
                opt.zero_grad()
            elif bug == "mean_of_means":
                (s / n / len(window)).backward()
            if bug == "step_every_micro_step" and i < len(window) - 1:
                continue
        if bug == "mean_of_means":
            opt.step()
            opt.zero_grad()
        snaps.append(flat_params(model))
    return snaps


@pytest.mark.parametrize("bug", BUGS)
def test_reference_catches_broken_loops(ddp_runs: list[dict], bug: str) -> None:
    snaps = ddp_runs[0]["broken"][bug]
    errors = update_errors(BROKEN_CASE, 2, snaps)
    assert errors[0] >= BROKEN_MIN_ERROR, errors


def test_gradient_before_the_boundary_is_not_the_reference() -> None:
    """Mid-window the accumulated gradient is partial: proof the test sees the window."""
    case = Case(accumulation_steps=4, micro_batches=4, seed=8)
    model = make_model(case)
    data = make_data(case, 1)[0]
    opt = make_optimizer(case, model.parameters())
    acc = Accumulator(model, opt, accumulation_steps=4, count_fn=count_tokens)
    ref_model = copy.deepcopy(model)
    total = sum(token_loss(ref_model, b)[0] for b in data)
    count = sum(float(count_tokens(b)) for b in data)
    (total / count).backward()
    ref_grad = ref_model.fc2.weight.grad.clone()
    for window in acc.windows(data):
        for micro in window:
            with micro:
                micro.backward(token_loss(model, micro.batch)[0])
                if micro.index == 2:
                    mid = model.fc2.weight.grad.clone()
                    rel = (mid - ref_grad).norm() / ref_grad.norm()
                    assert rel > BROKEN_MIN_ERROR
                if micro.is_last:
                    torch.testing.assert_close(model.fc2.weight.grad, ref_grad,
                                               rtol=1e-5, atol=1e-7)


# -- resume ------------------------------------------------------------------------------------

def _resume(rank: int, world: int, case: Case, split: int) -> bool:
    data = make_data(case, world)[rank]

    def build():
        ddp = DDP(make_model(case))
        opt = make_optimizer(case, ddp.parameters())
        sched = make_scheduler(case, opt)
        acc = Accumulator(ddp, opt, accumulation_steps=case.accumulation_steps,
                          scheduler=sched, max_grad_norm=case.max_grad_norm,
                          count_fn=count_tokens)
        return ddp, opt, sched, acc

    def loss_of(model):
        return lambda b: token_loss(model, b)[0]

    ddp, opt, sched, acc = build()
    for w in acc.windows(data):
        w.run(loss_of(ddp))
    uninterrupted = flat_params(ddp)

    ddp, opt, sched, acc = build()
    windows = acc.windows(data)
    for _ in range(split):
        next(windows).run(loss_of(ddp))
    ckpt = copy.deepcopy({"model": ddp.state_dict(), "opt": opt.state_dict(),
                          "sched": sched.state_dict(), "acc": acc.state_dict()})
    del ddp, opt, sched, acc, windows
    ddp, opt, sched, acc = build()
    ddp.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    sched.load_state_dict(ckpt["sched"])
    acc.load_state_dict(ckpt["acc"])
    for w in acc.windows(data[acc.micro_batches_consumed:]):
        w.run(loss_of(ddp))
    resumed = flat_params(ddp)
    same = all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)
    flag = torch.tensor([int(same)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item()) and acc.optimizer_steps == 6


def test_resume_at_a_boundary_is_bitwise_identical(ddp_runs: list[dict]) -> None:
    assert [run["resume"] for run in ddp_runs] == [True, True]
