"""The guard on the real engines whose correct loops it used to flag (issue 10), 2 gloo ranks,
all scenarios in ONE spawn: FSDP2's own accumulation (``set_requires_gradient_sync(False)``
leaves ``.grad`` None until the last micro-step) and DeepSpeed ZeRO-2/3 (gradients in engine
buffers; ``optimizer=None`` or the engine's ZeRO optimizer) pass; the broken variants of the
same loops still fail with their class (F3 on FSDP2; F2 and F14 on DeepSpeed)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from accumguard import run_on_ranks
from accumguard.demo.toy import token_loss
from accumguard.runtime.guard import guard

from helpers import Case, cpu_mesh, make_data, make_model

K = 4
CASE = Case(accumulation_steps=K, micro_batches=8, seed=5)


def _outcome(fn: Any) -> dict[str, Any]:
    """Run ``fn() -> guard``; the violation raised (if any), the recorded counts and notes."""
    try:
        g = fn()
    except Exception as e:  # noqa: BLE001 - the error is the result
        return {"error": type(e).__name__, "message": str(e)}
    return {"error": None, "summary": g.summary(), "notes": [n.kind for n in g.notes]}


def _fsdp2(rank: int, world: int, bug: str | None) -> Any:
    from torch.distributed.fsdp import fully_shard

    model = make_model(CASE)
    fully_shard(model, reshard_after_forward=False, mesh=cpu_mesh())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = make_data(CASE, world)[rank]
    with guard(model, opt, accumulation_steps=K) as g:
        for i, batch in enumerate(data):
            last = (i + 1) % K == 0
            model.set_requires_gradient_sync(last)  # FSDP2's recommended accumulation
            token_loss(model, batch)[0].div(100).backward()
            if bug == "zero_grad_inside_window":
                opt.zero_grad()  # clears the (sharded) .grad: the reduced sum is lost
            if last:
                opt.step()
                opt.zero_grad()
    return g


def _deepspeed(rank: int, world: int, stage: int, mode: str, pass_optimizer: bool) -> Any:
    import deepspeed

    model = make_model(CASE)
    ga = K if mode in ("native", "double", "coalesce-k-steps") else 1
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ga,
              "zero_optimization": {"stage": stage}, "gradient_clipping": 0.0,
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, ds_opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    data = make_data(CASE, world)[rank]
    with guard(engine, ds_opt if pass_optimizer else None, accumulation_steps=K) as g:
        for start in range(0, len(data), K):
            window = data[start:start + K]
            if mode == "native":  # config GA = K, backward and step on every micro-batch
                for batch in window:
                    engine.backward(token_loss(engine, batch)[0] / 100)
                    engine.step()
            elif mode == "coalesce":  # config GA = 1, one reduction per window
                with engine.coalesce_grad_reduction():
                    for batch in window:
                        engine.backward(token_loss(engine, batch)[0] / 100, scale_wrt_gas=False)
                engine.step()
            elif mode == "coalesce-k-steps":  # config GA = K: one block, then K step() calls
                with engine.coalesce_grad_reduction():  # (the engine steps at the K-th call)
                    for batch in window:
                        engine.backward(token_loss(engine, batch)[0] / 100)
                for _ in window:
                    engine.step()
            else:  # "manual" (GA = 1: F2 on ZeRO-1/2) or "double" (GA = K and a K-loop: F14)
                for batch in window:
                    engine.backward(token_loss(engine, batch)[0] / 100)
                engine.step()
    return g


def _accelerate(rank: int, world: int, bug: str | None) -> Any:
    """Accelerate's prepared objects: a DDP model, an ``AcceleratedOptimizer`` (which used
    to fail with AttributeError on ``_optimizer_step_pre_hooks``), an
    ``AcceleratedScheduler`` (steps its inner scheduler W times per call, by design)."""
    from accelerate import Accelerator

    accel = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model = make_model(CASE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    model, opt, sched = accel.prepare(model, opt, sched)
    data = make_data(CASE, world)[rank]
    with guard(model, opt, accumulation_steps=K, scheduler=sched) as g:
        for batch in data:
            if bug == "step_outside_accumulate":  # no accumulate(): every call steps
                accel.backward(token_loss(model, batch)[0] / 100)
                opt.step()
                sched.step()
                opt.zero_grad()
                continue
            with accel.accumulate(model):
                accel.backward(token_loss(model, batch)[0] / 100)
                opt.step()
                sched.step()
                opt.zero_grad()
    return g


def _all(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for bug in (None, "zero_grad_inside_window"):
        out[f"fsdp2-{bug}"] = _outcome(lambda bug=bug: _fsdp2(rank, world, bug))
    for bug in (None, "step_outside_accumulate"):
        out[f"accelerate-{bug}"] = _outcome(lambda bug=bug: _accelerate(rank, world, bug))
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")  # reuses the harness's process group
    for stage, mode, pass_opt in ((2, "native", False), (3, "native", True),
                                  (2, "coalesce", True), (2, "manual", False),
                                  (1, "double", False), (2, "coalesce-k-steps", False)):
        out[f"ds{stage}-{mode}"] = _outcome(
            lambda s=stage, m=mode, p=pass_opt: _deepspeed(rank, world, s, m, p))
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return run_on_ranks(_all, 2, timeout=600)


def test_fsdp2_requires_gradient_sync_accumulation_passes(results: list[dict]) -> None:
    for r in results:
        out = r["fsdp2-None"]
        assert out["error"] is None, out
        assert out["summary"]["optimizer_steps"] == 2 and out["summary"]["backward_passes"] == 8


def test_fsdp2_zero_grad_inside_window_is_still_f3(results: list[dict]) -> None:
    for r in results:
        out = r["fsdp2-zero_grad_inside_window"]
        assert out["error"] == "ZeroGradInsideWindowError", out
        assert "[F3 " in out["message"] and "window 0, micro-step 0" in out["message"]


def test_accelerate_prepared_objects_attach_and_pass(results: list[dict]) -> None:
    for r in results:
        out = r["accelerate-None"]
        assert out["error"] is None, out
        s = out["summary"]
        assert (s["optimizer_steps"], s["backward_passes"], s["scheduler_steps"]) == (2, 8, 2)
        assert s["sync_rounds"] == 2  # accumulate() defers DDP's all-reduce to the last one
        bad = r["accelerate-step_outside_accumulate"]
        assert bad["error"] == "StepInsideWindowError", bad
        assert "window 0, micro-step 0" in bad["message"]


@pytest.mark.parametrize("key", ["ds2-native", "ds3-native", "ds2-coalesce",
                                 "ds2-coalesce-k-steps"])
def test_deepspeed_correct_loops_pass(results: list[dict], key: str) -> None:
    """ZeRO-2/3 keep gradients in engine buffers (.grad None): no F3, one step per window,
    with optimizer=None and with the engine's ZeRO optimizer; K backwards in one coalesced
    block then K ``engine.step()`` calls (blind round 99 b_b01_fixed) is not double gating."""
    for r in results:
        out = r[key]
        assert out["error"] is None, out
        assert out["summary"]["optimizer_steps"] == 2 and out["summary"]["backward_passes"] == 8
        assert out["summary"]["violations"] == 0


def test_deepspeed_broken_loops_fail_with_their_class(results: list[dict]) -> None:
    manual = results[0]["ds2-manual"]
    assert manual["error"] == "EngineBoundaryResetError", manual
    assert "[F2 " in manual["message"] and "window 0, micro-step 0" in manual["message"]
    double = results[1]["ds1-double"]
    assert double["error"] == "DoubleGatingError", double
    assert "[rank 1] [F14 " in double["message"]
    assert "engine.step() after 4 backward passes" in double["message"]
