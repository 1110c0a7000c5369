"""This session's code in users' processes fails inside its doors and changes nothing: the
wrapper DDP's ``register_comm_hook`` gets (before and after the registration), the read of
each bucket's sum inside the script's hook, the count of the script's collectives (an
``all_reduce`` of a token count between backwards) and the bucket sums read at the step.
One gloo rank, DDP with a summing hook under ``no_sync``: the weights are bit-equal to the
unobserved run, observation switches off, and the failure is accumguard's own."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812

from accumguard.observe._failsafe import ENV_FAULT
from accumguard.watch._recording import recording

from helpers import free_port

K, STEPS = 3, 3


def _sum_hook(state, bucket):  # type: ignore[no-untyped-def]
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _train() -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)))
    model.register_comm_hook(None, _sum_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        for m in range(K):
            x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            count = torch.tensor(float(y.numel()))
            dist.all_reduce(count)  # a collective between backwards (the counter)
            with model.no_sync() if m < K - 1 else contextlib.nullcontext():
                (F.cross_entropy(model(x), y, reduction="sum") / (count * K)).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield None
    dist.destroy_process_group()


@pytest.mark.parametrize(("label", "when", "nth"), [
    ("hook:comm_hook", "pre", 2),
    ("register_comm_hook", "pre", 1), ("register_comm_hook", "post", 1),
    ("all_reduce", "pre", 2), ("all_reduce", "post", 3),
])
def test_a_fault_around_the_comm_hook_and_collectives_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_rank: object,
        label: str, when: str, nth: int) -> None:
    plain = _train()
    monkeypatch.setenv(ENV_FAULT, f"{label}:{when}@{nth}")
    with recording(tmp_path) as obs:
        params = _train()
        failure = obs.failure
    assert failure is not None, "the injected fault did not fire"
    assert "InjectedFault" in failure.error
    for a, b in zip(params, plain, strict=True):
        assert torch.equal(a, b), f"{label}:{when}@{nth} changed the training"


def test_a_fault_reading_the_bucket_sums_at_the_step_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_rank: object) -> None:
    from accumguard.observe._window import StepTally

    plain = _train()

    def broken(self: object) -> object:
        raise RuntimeError("injected: bucket sums")

    monkeypatch.setattr(StepTally, "_hook_in", broken)
    with recording(tmp_path) as obs:
        params = _train()
        failure = obs.failure
    assert failure is not None and "bucket sums" in failure.error + failure.traceback
    for a, b in zip(params, plain, strict=True):
        assert torch.equal(a, b)


def test_a_fault_listing_the_parameters_outside_ddp_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_rank: object) -> None:
    """The step's read of the optimizer's parameters that no DDP module holds (the F10 rule
    for a loss module's temperature outside the wrapper)."""
    from accumguard.observe._steps import StepMachinery

    plain = _train()

    def broken(self: object, opt: object) -> object:
        raise RuntimeError("injected: parameters outside DDP")

    monkeypatch.setattr(StepMachinery, "_unwrapped", broken)
    with recording(tmp_path) as obs:
        params = _train()
        failure = obs.failure
    assert failure is not None and "outside DDP" in failure.error + failure.traceback
    for a, b in zip(params, plain, strict=True):
        assert torch.equal(a, b)


def test_a_fault_reading_joins_divisor_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_rank: object) -> None:
    """The step's read of DDP's ``divide_by_initial_world_size`` (set by ``Join``)."""
    from accumguard.observe._steps import StepMachinery

    plain = _train()

    def broken(self: object) -> object:
        raise RuntimeError("injected: Join's divisor")

    monkeypatch.setattr(StepMachinery, "_join_initial", broken)
    with recording(tmp_path) as obs:
        params = _train()
        failure = obs.failure
    assert failure is not None and "Join's divisor" in failure.error + failure.traceback
    for a, b in zip(params, plain, strict=True):
        assert torch.equal(a, b)
