"""The loop catalog under the audit: every broken loop is caught *and* named, every
Accumulator loop and every correct hand-written loop (several styles) passes.

One spawn for the whole torch matrix (DDP, ZeRO-1, FSDP2 ZeRO-2/3-like) on the small
TokenMLP, 2 optimizer steps; DeepSpeed is covered by the slow full demo in test_demo.py.
The verdicts come from the audit, which compares every step with the fp64
single-process reference (relative update error ≤ 1e-5, mission.md).

The same spawn then runs three of the catalogue's loops on ranks where CUDA *looks*
visible (``test_catalogue_runs_on_gloo_with_cuda_visible``; its own module and spawn
before, same setup and steps): no GPU here, so each rank fakes one
(``torch.cuda.is_available()`` True, one device, torch's current accelerator CUDA, what
FSDP2's default mesh reads). A ``fully_shard`` without a mesh then asks for a CUDA mesh
and fails (checked first, so the fake is known to bite); the catalogue's loops, with
their explicit mesh on ``ctx.device`` (the CPU under gloo), must still run and pass the
audit. They run after the matrix, each inside its own patches, undone when it ends.
"""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

import pytest
import torch

from accumguard.core.errors import ConfigError
from accumguard.demo.demo import demo_setup
from accumguard.demo.loops import (
    ENGINES,
    accumulator_loop,
    catalog,
    engine_available,
    handwritten_loop,
)
from accumguard.verify.contract import LoopContext

TORCH_ENGINES = ("ddp", "zero1", "fsdp2-zero2", "fsdp2-zero3")
STEPS = 2
CUDA_VISIBLE = "cuda-visible/"


def _default_mesh_is_cuda() -> bool:
    """Whether FSDP2 without a mesh now fails for want of CUDA (the fake is effective)."""
    from torch.distributed.fsdp import fully_shard

    try:
        fully_shard(torch.nn.Linear(2, 2))
    except Exception:  # noqa: BLE001 - any failure: it tried the (absent) CUDA device
        return True
    return False


def _as_if_cuda_visible(loop: Any, ctx: LoopContext) -> None:
    cuda = torch.device("cuda")
    with mock.patch.object(torch.cuda, "is_available", return_value=True), \
            mock.patch.object(torch.cuda, "device_count", return_value=1), \
            mock.patch.object(torch._C, "_get_accelerator", return_value=cuda):
        if ctx.device.type != "cpu":
            raise AssertionError(f"gloo rank {ctx.rank} got device {ctx.device}, not cpu")
        if not _default_mesh_is_cuda():
            raise AssertionError("the fake CUDA host did not make FSDP2's default mesh CUDA")
        loop(ctx)


def _cuda_visible_loops() -> dict[str, Any]:
    loops = {
        "ddp/accumulator": functools.partial(accumulator_loop, engine="ddp"),
        "fsdp2-zero2/accumulator": functools.partial(accumulator_loop, engine="fsdp2-zero2"),
        "fsdp2-zero3/correct": functools.partial(handwritten_loop, engine="fsdp2-zero3"),
    }
    return {CUDA_VISIBLE + k: functools.partial(_as_if_cuda_visible, v)
            for k, v in loops.items()}


@pytest.fixture(scope="module")
def audited() -> tuple[dict, dict]:
    """(the matrix's reports by key, with their catalogue item; the CUDA-visible reports)."""
    from accumguard.verify.audit import audit_many

    items = catalog(TORCH_ENGINES)
    setup = demo_setup(model="mlp", steps=STEPS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = audit_many(setup, {**{it.key: it.loop for it in items}, **_cuda_visible_loops()},
                         timeout=600)
    finally:
        torch.set_num_threads(threads)
    return ({it.key: (it, got[it.key]) for it in items},
            {k: v for k, v in got.items() if k.startswith(CUDA_VISIBLE)})


@pytest.fixture(scope="module")
def reports(audited: tuple[dict, dict]) -> dict:
    return audited[0]


def test_matrix_covers_every_kind_on_every_torch_engine(reports: dict) -> None:
    for engine in TORCH_ENGINES:
        kinds = {it.kind for it, _ in reports.values() if it.engine == engine}
        assert kinds == {"accumulator", "correct", "broken"}, (engine, kinds)
    # Different correct styles are exercised (false-alarm checks).
    assert {"ddp/correct", "ddp/correct-flag", "fsdp2-zero2/correct"} <= set(reports)


def test_accumulator_loops_pass(reports: dict) -> None:
    for key, (it, rep) in reports.items():
        if it.kind == "accumulator":
            assert rep.passed, (key, rep.failures)
            assert rep.max_update_error <= 1e-5, (key, rep.max_update_error)
            assert rep.optimizer_steps == STEPS


def test_correct_handwritten_loops_pass(reports: dict) -> None:
    for key, (it, rep) in reports.items():
        if it.kind == "correct":
            assert rep.passed, (key, rep.failures)
            assert rep.diagnosis is None


def test_broken_loops_fail_and_are_named(reports: dict) -> None:
    seen = set()
    for key, (it, rep) in reports.items():
        if it.kind != "broken":
            continue
        assert not rep.passed, key
        # A real difference, far above fp32 noise.
        assert rep.max_update_error > 1e-2, (key, rep.max_update_error)
        assert rep.diagnosis is not None and rep.diagnosis.explained, (key, rep.diagnosis)
        assert rep.diagnosis.bug_id == it.expected, (key, rep.diagnosis.summary())
        seen.add(it.expected)
    assert seen == {"F1", "F3", "F4", "F5"}


def test_deferred_loops_sync_once_per_step(reports: dict) -> None:
    """Accumulator and correct loops on DDP/ZeRO-1 reduce gradients once per optimizer step."""
    for key, (it, rep) in reports.items():
        if it.kind != "broken" and it.engine in ("ddp", "zero1"):
            assert rep.counts_per_step()["grad_collective_rounds"] == 1, key
    f1 = reports["ddp/bug-F1"][1]
    assert f1.optimizer_steps == 4 * STEPS  # K=4 steps per window


def test_catalog_shape() -> None:
    items = catalog(ENGINES)
    keys = [it.key for it in items]
    assert len(keys) == len(set(keys))
    for engine in ENGINES:
        mine = [it for it in items if it.engine == engine]
        assert mine[0].name == "accumulator" and mine[0].expected == "pass"
    ds_bugs = {it.expected for it in items if it.engine.startswith("deepspeed")
               and it.kind == "broken"}
    assert ds_bugs == {"F2"}
    quick = catalog(("ddp",), quick=True)
    assert len(quick) < len(catalog(("ddp",)))
    only = catalog(("ddp", "deepspeed-z2"), bugs=("F1", "F2"))
    assert {(it.engine, it.expected) for it in only if it.kind == "broken"} == {
        ("ddp", "F1"), ("deepspeed-z2", "F2")}


def test_bad_arguments_are_explained() -> None:
    with pytest.raises(ConfigError, match="unknown engine"):
        catalog(("megatron",))
    with pytest.raises(ConfigError, match="unknown engine"):
        engine_available("megatron")
    setup = demo_setup(model="mlp", steps=1)
    ctx = LoopContext(rank=0, world_size=1, setup=setup, model=setup.build_model(),
                      batches=setup.rank_batches(0, 1))
    with pytest.raises(ConfigError, match="DeepSpeed configuration bug"):
        handwritten_loop(ctx, engine="ddp", bug="F2")
    with pytest.raises(ConfigError, match="unknown bug"):
        handwritten_loop(ctx, engine="ddp", bug="F42")
    for engine in TORCH_ENGINES:
        assert engine_available(engine) is None


def test_catalogue_runs_on_gloo_with_cuda_visible(audited: tuple[dict, dict]) -> None:
    cuda_reports = audited[1]
    assert len(cuda_reports) == 3, list(cuda_reports)
    for key, rep in cuda_reports.items():
        assert rep.passed, (key, rep.failures)
        assert rep.max_update_error <= 1e-5, (key, rep.max_update_error)
