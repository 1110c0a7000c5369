"""The catalogue's loops on gloo ranks of a host where CUDA *looks* visible.

No GPU here, so each rank fakes one: ``torch.cuda.is_available()`` True, one device, and
torch's current accelerator CUDA (what FSDP2's default mesh reads). A ``fully_shard``
without a mesh then asks for a CUDA mesh and fails (checked first, so the fake is known to
bite); the catalogue's loops, with their explicit mesh on ``ctx.device`` (the CPU under
gloo), must still run and pass the audit. One spawn.
"""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

import torch

from accumguard.demo.demo import demo_setup
from accumguard.demo.loops import accumulator_loop, handwritten_loop
from accumguard.verify.contract import LoopContext


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


def test_catalogue_runs_on_gloo_with_cuda_visible() -> None:
    from accumguard.verify.audit import audit_many

    loops = {
        "ddp/accumulator": functools.partial(accumulator_loop, engine="ddp"),
        "fsdp2-zero2/accumulator": functools.partial(accumulator_loop, engine="fsdp2-zero2"),
        "fsdp2-zero3/correct": functools.partial(handwritten_loop, engine="fsdp2-zero3"),
    }
    wrapped = {k: functools.partial(_as_if_cuda_visible, v) for k, v in loops.items()}
    reports = audit_many(demo_setup(model="mlp", steps=2), wrapped, timeout=600,
                         diagnose=False)
    for key, rep in reports.items():
        assert rep.passed, (key, rep.failures)
        assert rep.max_update_error <= 1e-5, (key, rep.max_update_error)
