"""ZeRO-1 on torch (ZeroRedundancyOptimizer over DDP) on 2 real gloo ranks vs the reference.

Grid: sync ∈ {deferred, eager} × K ∈ {1, 4}, partial final windows, uneven token
counts over micro-steps and ranks, with and without clipping, SGD and AdamW.
Criterion: relative update error ≤ 1e-5 after every step (fp32 vs fp64 reference).
One spawn for the whole module.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pytest
import torch

from accumguard.demo.toy import token_loss
from accumguard.verify.reference import (
    ReferenceRun,
    reference_run,
    relative_update_error,
    windows_for_reference,
)

from helpers import (
    FP32_UPDATE_TOL,
    Case,
    engine_cases,
    make_data,
    make_model,
    make_optimizer,
    make_scheduler,
    reference_for,
    train_with_accumulator,
)

CASES = engine_cases(21)
GRID = [case.with_(sync=sync) for sync in ("deferred", "eager") for case in CASES]


def _zero_optimizer(case: Case, params: list) -> torch.optim.Optimizer:
    """A ZeroRedundancyOptimizer with the same class and hyper-parameters as helpers'."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    base = make_optimizer(case, [torch.nn.Parameter(torch.zeros(1))])
    accepted = inspect.signature(type(base)).parameters
    kwargs = {k: v for k, v in base.defaults.items()
              if k in ("lr", "momentum", "weight_decay", "betas", "eps") and k in accepted}
    return ZeroRedundancyOptimizer(params, optimizer_class=type(base), **kwargs)


def _zero1_grid(rank: int, world: int, grid: list[Case]) -> dict:
    import time

    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumguard.core.errors import ConfigError
    from accumguard.engines import resolve_engine
    from accumguard.engines.zero1 import Zero1Engine

    t0 = time.perf_counter()
    out = []
    for case in grid:
        ddp = DDP(make_model(case))
        opt = _zero_optimizer(case, list(ddp.parameters()))
        engine = Zero1Engine(ddp, opt, sync=case.sync)
        snaps, colls, acc = train_with_accumulator(
            case, ddp, engine, make_data(case, world)[rank], optimizer=opt,
            scheduler=make_scheduler(case, opt))
        norms = [None if r.grad_norm is None else float(r.grad_norm) for r in acc.history]
        local = sum(len(g["params"]) for g in opt.optim.param_groups)
        out.append({"snaps": snaps, "colls": colls, "steps": acc.optimizer_steps,
                    "norms": norms, "local_params": local,
                    "total_params": len(list(ddp.parameters()))})
    ddp = DDP(make_model(CASES[0]))
    opt = _zero_optimizer(CASES[0], list(ddp.parameters()))
    auto = type(resolve_engine(ddp, opt)).__name__
    try:
        Zero1Engine(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1))
        plain = "accepted"
    except ConfigError as e:
        plain = str(e)
    return {"grid": out, "auto": auto, "plain": plain, "seconds": time.perf_counter() - t0}


def _zero1_shared(rank: int, world: int) -> dict:
    return _zero1_grid(rank, world, GRID)


@pytest.fixture(scope="module")
def zero1_results(torch_spawn: dict[str, list[Any]]) -> dict:
    """Rank 0 of ``_zero1_grid`` over GRID, run in the session's shared gloo spawn
    (``ds_spawn.TORCH_WORKERS``)."""
    out: dict = torch_spawn["test_zero1"][0]
    return out


@functools.cache
def _reference(case: Case) -> ReferenceRun:
    """The fp64 reference; it does not depend on the sync mode, so it is shared."""
    return reference_for(case, 2)


def _errors(case: Case, snapshots: list[dict]) -> list[float]:
    ref = _reference(case.with_(sync="deferred"))
    assert len(snapshots) == len(ref.params), (case, len(snapshots), len(ref.params))
    return [relative_update_error(ref.initial, s, r)
            for s, r in zip(snapshots, ref.params, strict=True)]


def test_zero1_matches_reference_after_every_step(zero1_results: dict) -> None:
    worst = 0.0
    for case, res in zip(GRID, zero1_results["grid"], strict=True):
        errors = _errors(case, res["snaps"])
        assert max(errors) <= FP32_UPDATE_TOL, (case, errors)
        print(f"{case.sync}-K{case.accumulation_steps}-{case.optimizer}: max error "
              f"{max(errors):.2e} over {len(errors)} steps")
        worst = max(worst, max(errors))
    print(f"max relative update error over the ZeRO-1 grid ({len(GRID)} runs): {worst:.2e}; "
          f"worker time {zero1_results['seconds']:.1f} s")


def test_zero1_optimizer_state_is_sharded(zero1_results: dict) -> None:
    """Rank 0's local optimizer holds only part of the parameters: ZeRO-1 was really on."""
    for res in zero1_results["grid"]:
        assert 0 < res["local_params"] < res["total_params"], res


def test_zero1_clips_by_the_global_norm(zero1_results: dict) -> None:
    checked = 0
    for case, res in zip(GRID, zero1_results["grid"], strict=True):
        if case.max_grad_norm is None:
            continue
        windows = windows_for_reference(make_data(case, 2), case.accumulation_steps)
        ref = reference_run(make_model(case), lambda p, c=case: make_optimizer(c, p),
                            windows[:1], token_loss)
        ref_norm = torch.cat([g.flatten() for g in ref.grads[0].values()]).norm().item()
        assert res["norms"][0] == pytest.approx(ref_norm, rel=1e-5), (case, res["norms"])
        assert ref_norm > case.max_grad_norm  # clipping was active
        checked += 1
    assert checked == 4


def test_zero1_collectives_per_step(zero1_results: dict) -> None:
    """Gradient all-reduce rounds only: ZeRO's parameter broadcasts are not gradient traffic."""
    for case, res in zip(GRID, zero1_results["grid"], strict=True):
        k, m = case.accumulation_steps, case.micro_batches
        if case.sync == "deferred":
            expected = [1] * res["steps"]
        else:
            expected = [k] * (m // k) + ([m % k] if m % k else [])
        assert res["colls"] == expected, (case, res["colls"])


def test_zero1_is_resolved_and_validated(zero1_results: dict) -> None:
    assert zero1_results["auto"] == "Zero1Engine"
    assert "ZeroRedundancyOptimizer" in zero1_results["plain"]
    assert "got SGD" in zero1_results["plain"]
