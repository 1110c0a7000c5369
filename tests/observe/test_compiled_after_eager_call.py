"""Compiled DDP models under the observer.

A DDP model called once eagerly (hooked by the observer), then compiled and trained
(blind round 36 a_c03: an Accelerate-prepared PEFT model compiled after reference log-probs
were taken eagerly). Dynamo traced the observer's forward hooks of the inner module and
raised an AssertionError into the user's code; no observer code may go into a compiled
graph. The watched run must finish with the same bits as the unwatched one.

Blind round 42 b_c03: a DDP model with a comm hook and ``no_sync``, compiled as a whole.
The observer's forward pre-hook then ran in eager code that Dynamo's frame callback still
watched, and the callback compiled the weak map lookup the hook made: an AssertionError in
the hook, observation switched off after 0 steps (the run itself went on unchanged)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

from helpers import recorded_failures

K = 4


def _train(out: Path | None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(3, 4, generator=g) for _ in range(2 * K)]
    with recording(out) if out is not None else contextlib.nullcontext():
        with torch.no_grad():
            model(data[0])  # an eager call first: the observer hooks the module
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        fwd = torch.compile(ddp, backend="aot_eager")
        for i, x in enumerate(data):
            (fwd(x).pow(2).mean() / K).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
    torch._dynamo.reset()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.usefixtures("one_rank_group")
def test_a_compiled_ddp_model_hooked_before_trains_unchanged(tmp_path: Path) -> None:
    watched = _train(tmp_path)
    plain = _train(None)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    rec = load_recordings(tmp_path)
    assert [int(s["backwards"]) for s in rec.steps[0]] == [K, K]
    assert [f for f in analyze(rec)[0] if f.severity.value == "error"] == []


def _allreduce_sum(pg, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


def _train_no_sync_hooked(out: Path | None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(3, 4, generator=g) for _ in range(2 * K)]
    with recording(out) if out is not None else contextlib.nullcontext():
        ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        ddp.register_comm_hook(None, _allreduce_sum)
        fwd = torch.compile(ddp, backend="aot_eager")
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for i, x in enumerate(data):
            with ddp.no_sync() if i % K < K - 1 else contextlib.nullcontext():
                (fwd(x).pow(2).mean() / K).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
    torch._dynamo.reset()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.usefixtures("one_rank_group")
def test_a_compiled_ddp_model_with_comm_hook_and_no_sync_is_observed(tmp_path: Path) -> None:
    watched = _train_no_sync_hooked(tmp_path)
    plain = _train_no_sync_hooked(None)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    assert recorded_failures(tmp_path) == []
    rec = load_recordings(tmp_path)
    assert [int(s["backwards"]) for s in rec.steps[0]] == [K, K]
    assert [f for f in analyze(rec)[0] if f.severity.value == "error"] == []


@pytest.mark.usefixtures("one_rank_group")
def test_a_fault_in_the_dynamo_path_of_the_hook_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The branch taken when Dynamo's frame callback is set outside a trace, made to fail
    (a fault that cannot be caused for real once the weak-map lookup is fixed): the user's
    run goes on with the same bits, and the failure is recorded as accumguard's own."""
    from accumguard.observe import _forwards

    def broken(seams: object, module: object) -> None:
        raise RuntimeError("injected fault in the Dynamo path of _global_pre")

    plain = _train_no_sync_hooked(None)
    monkeypatch.setattr(_forwards, "_GET_CALLBACK", lambda: object())  # "callback set"
    monkeypatch.setattr(_forwards, "_EAGER_ENTER", broken)
    watched = _train_no_sync_hooked(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    errors = recorded_failures(tmp_path)
    assert errors and errors[0]["where"] == "hook:_global_pre", errors
    assert "injected fault in the Dynamo path" in errors[0]["error"]
    assert list(load_recordings(tmp_path).failures) == [0]
