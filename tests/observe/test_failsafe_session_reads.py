"""Faults injected in what this session added to a user's process: the record of a clip
given tensors without gradients (the clip patch), Accelerate's loader state read at its
backward (the backward patch), the class-weight count of a weighted ``cross_entropy`` and
the walk below a loss term for a penalty on the parameters (the loss recorder), the read of a
new optimizer's gradients at its first backward (a resume's restored window), the test at each
optimizer step for DCP's state-initialising step, the read of DDP's registered
parameters at a step (which parameters DDP does not reduce) and the test of which stepped
parameters no FSDP2 unit holds. Each fails
inside its door: observation switches off, the failure is recorded as accumguard's, and the
trained weights are bit-equal to the unobserved run's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.watch._recording import recording

K = 3
WEIGHT = torch.tensor([0.5, 1.0, 2.0])


class _Broken(list):  # type: ignore[type-arg]
    """A list whose every change raises: the injected fault of a record."""

    def append(self, item: Any) -> None:
        raise RuntimeError("injected: a record of this session's reads")

    def __setitem__(self, i: Any, v: Any) -> None:
        raise RuntimeError("injected: a record of this session's reads")


def _loop() -> list[torch.Tensor]:
    """Weighted cross-entropy plus a penalty on the parameters, and a clip given the
    gradients (which holds none of its own): every read above runs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for _ in range(K):
            x, y = torch.randn(6, 5, generator=g), torch.randint(0, 3, (6,), generator=g)
            ce = F.cross_entropy(model(x), y, weight=WEIGHT)
            penalty = sum(w.pow(2).sum() for n, w in model.named_parameters() if "weight" in n)
            (ce / K + 1e-3 * penalty).backward()
        torch.nn.utils.clip_grad_norm_([p.grad for p in model.parameters()], 0.5)
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _fault(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Install the fault named ``where``."""
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError(f"injected: {where}")

    if where == "params_only":
        import accumguard.observe._losses_terms as terms
        monkeypatch.setattr(terms, "params_only", broken)
    elif where == "read_class_loss":
        import accumguard.observe._losses as losses
        monkeypatch.setattr(losses, "read_class_loss", broken)
    elif where == "is_state_init_step":
        import accumguard.observe._observer as observer
        monkeypatch.setattr(observer, "is_state_init_step", broken)
    elif where == "held_at_first":
        import accumguard.observe._lanes as lanes
        monkeypatch.setattr(lanes.Lanes, "held_at_first", broken)
    elif where == "look_at_newborns":
        import accumguard.observe._lanes as lanes
        monkeypatch.setattr(lanes.Lanes, "_look_at_newborns", broken)
    elif where == "clip_empty":
        import accumguard.observe._window as window
        init = window.StepTally.__init__

        def tally(self: Any) -> None:
            init(self)
            self.clip_empty = _Broken()

        monkeypatch.setattr(window.StepTally, "__init__", tally)


@pytest.mark.parametrize("where", ["clip_empty", "params_only", "read_class_loss",
                                   "look_at_newborns", "held_at_first", "is_state_init_step"])
def test_a_fault_in_a_read_of_the_loop_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    plain = _loop()
    _fault(monkeypatch, where)
    with recording(tmp_path) as obs:
        seen = _loop()
        failure = obs.failure
    assert failure is not None, where
    assert "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))


def _accelerate_loop(obs: Any | None, broken_loader: bool = True) -> list[torch.Tensor]:
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    GradientState._reset_state()
    AcceleratorState._reset_state(True)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=K)
    model, opt = acc.prepare(model, opt)
    if obs is not None and broken_loader:
        obs.accelerate_loader = _Broken([0, 0])
    g = torch.Generator().manual_seed(2)
    for _ in range(2 * K):
        with acc.accumulate(model):
            acc.backward(model(torch.randn(4, 5, generator=g)).pow(2).mean())
            opt.step()
            opt.zero_grad()
    out = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
    GradientState._reset_state()
    AcceleratorState._reset_state(True)
    return out


def test_a_fault_reading_accelerates_loader_state_changes_nothing(tmp_path: Path) -> None:
    plain = _accelerate_loop(None)
    with recording(tmp_path) as obs:
        seen = _accelerate_loop(obs)
        failure = obs.failure
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))


def test_a_fault_counting_accelerates_blocks_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read of Accelerate's block counter at each accelerator.backward: a fault in it
    switches observation off, is reported, and the trained parameters are unchanged."""
    plain = _accelerate_loop(None)
    import accumguard.observe._observer as observer

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected: Accelerate's block counter")

    monkeypatch.setattr(observer.Observer, "accelerate_block", broken)
    with recording(tmp_path) as obs:
        seen = _accelerate_loop(obs, broken_loader=False)
        failure = obs.failure
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))


class _BrokenDict(dict):  # type: ignore[type-arg]
    def setdefault(self, key: Any, default: Any = None) -> Any:
        raise RuntimeError("injected: the K an Accelerator was built with")


def test_a_fault_reading_the_accelerators_constructed_k_changes_nothing(tmp_path: Path) -> None:
    """The read of ``gradient_accumulation_steps`` right after ``Accelerator(...)`` (a later
    Accelerator() resets it for all): a fault there switches observation off, is reported,
    and the trained parameters are unchanged."""
    plain = _accelerate_loop(None)
    with recording(tmp_path) as obs:
        obs.declared_k = _BrokenDict()
        seen = _accelerate_loop(obs, broken_loader=False)
        failure = obs.failure
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert "in init" in failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))


def _ds_scheduled_loop() -> list[float]:
    """A torch optimizer under DeepSpeed's own WarmupDecayLR (no engine needed): the learning
    rates the schedule gave, step by step."""
    lr_schedules = pytest.importorskip("deepspeed.runtime.lr_schedules")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = lr_schedules.WarmupDecayLR(opt, total_num_steps=8, warmup_max_lr=0.1,
                                       warmup_num_steps=2)
    lrs = []
    for _ in range(6):
        for _ in range(K):
            model(torch.ones(2, 4)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def test_a_fault_reading_a_deepspeed_schedule_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The observer's wrapper of DeepSpeed's scheduler steps (this session): a fault in the
    read of the schedule's state switches observation off; the schedule is unchanged."""
    plain = _ds_scheduled_loop()
    import accumguard.observe._observer as observer

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected: a DeepSpeed schedule's read")

    monkeypatch.setattr(observer.Observer, "_count_sched", broken)
    with recording(tmp_path) as obs:
        seen = _ds_scheduled_loop()
        failure = obs.failure
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert seen == plain


class _NoNames(dict):  # type: ignore[type-arg]
    def get(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected: the parameters' names")


def _end_line(out: Path) -> dict[str, Any]:
    import json

    lines = [json.loads(x) for x in (out / "rank-0.jsonl").read_text().splitlines()]
    return next(x for x in lines if x["kind"] == "end")


@pytest.mark.parametrize("broken", [False, True])
def test_the_end_lines_parameter_names_never_cost_the_record(tmp_path: Path,
                                                             broken: bool) -> None:
    """The end line lists the checksummed parameters' names (a finding about some of them
    names them); a fault reading them, at exit, loses the names only: the end line is
    written, the run unchanged."""
    plain = _loop()
    with recording(tmp_path) as obs:
        if broken:
            obs._tracked_names = _NoNames()
        seen = _loop()
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    end = _end_line(tmp_path)
    assert end["reason"] == "exit" and end["steps"] == 3
    if broken:
        assert "tracked" not in end
    else:
        assert end["tracked"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_a_fault_reading_a_penalty_sum_changes_nothing(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk below each backward reads a sum over many parameters as one penalty term
    (``_losses_walk._penalty_sum``, this session). A fault in it of a kind the walk does not
    expect (a LookupError, not one of the graph errors it treats as an unusual graph) switches
    observation off and is reported; the trained parameters are bit-equal."""
    import accumguard.observe._losses_walk as walk

    plain = _loop()

    def broken(node: object) -> bool:
        raise LookupError("injected: the penalty sum's read")

    monkeypatch.setattr(walk, "_penalty_sum", broken)
    with recording(tmp_path) as obs:
        seen = _loop()
        failure = obs.failure
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))


def _ddp_loop() -> list[torch.Tensor]:
    """A DDP model (one-rank group) accumulating K backwards per step under no_sync."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        for m in range(K):
            x, y = torch.randn(6, 5, generator=g), torch.randint(0, 3, (6,), generator=g)
            with ddp.no_sync() if m < K - 1 else torch.enable_grad():
                (F.cross_entropy(ddp(x), y) / K).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in ddp.module.parameters()]


def test_a_fault_reading_ddps_registered_parameters_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read of DDP's registered parameters at a step (which of the optimizer's
    parameters DDP does not reduce): a fault in it switches observation off, is reported as
    accumguard's, and the trained parameters are bit-equal to the unobserved run's."""
    import torch.distributed as dist

    import accumguard.observe._loose as loose

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain = _ddp_loop()

        def broken(root: object) -> list[object]:
            raise RuntimeError("injected: DDP's registered parameters")

        monkeypatch.setattr(loose, "_registered", broken)
        with recording(tmp_path) as obs:
            seen = _ddp_loop()
            failure = obs.failure
    finally:
        dist.destroy_process_group()
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))


def _fsdp2_loop() -> list[torch.Tensor]:
    """An FSDP2 model (one-rank group) and a temperature outside its units, K backwards
    per step: the per-step read of the parameters no unit holds runs."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    fully_shard(net)
    temp = torch.nn.Parameter(torch.ones(()))
    opt = torch.optim.SGD([*net.parameters(), temp], lr=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        for _ in range(K):
            x, y = torch.randn(6, 5, generator=g), torch.randint(0, 3, (6,), generator=g)
            (F.cross_entropy(net(x) * temp, y) / K).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().full_tensor().clone() if hasattr(p, "full_tensor") else p.detach().clone()
            for p in [*net.parameters(), temp]]


def test_a_fault_reading_the_parameters_outside_fsdp2_units_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test of which stepped parameters no ``fully_shard`` unit holds (and their
    gradients' checksum): a fault in it switches observation off, is reported as
    accumguard's, and the trained parameters are bit-equal to the unobserved run's."""
    import torch.distributed as dist

    import accumguard.observe._loose as loose

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain = _fsdp2_loop()

        def broken(p: object) -> bool:
            raise RuntimeError("injected: a parameter outside the units")

        monkeypatch.setattr(loose, "_plain", broken)
        with recording(tmp_path) as obs:
            seen = _fsdp2_loop()
            failure = obs.failure
    finally:
        dist.destroy_process_group()
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))


def test_a_fault_reading_the_fsdp2_mesh_size_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read of how many ranks each FSDP2 unit's mesh spans (at a step whose reduction
    factor is 1: a one-rank mesh): a fault in it switches observation off, is reported as
    accumguard's, and the trained parameters are bit-equal to the unobserved run's."""
    import torch.distributed as dist

    import accumguard.observe._steps as steps

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain = _fsdp2_loop()

        def broken(*args: object) -> int:
            raise KeyError("injected: the FSDP2 mesh size")

        monkeypatch.setattr(steps, "fsdp2_mesh", broken)
        with recording(tmp_path) as obs:
            seen = _fsdp2_loop()
            failure = obs.failure
    finally:
        dist.destroy_process_group()
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
