"""The audit's device plumbing, without a GPU: each rank's device decision (on a simulated
CUDA host), TF32 off in audited ranks and restored after, TF32 switched back on by a loop
judged at its precision, and every comparison on CPU float64 whatever the loop's device."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.distributed as dist

from accumguard.core.errors import ConfigError
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss
from accumguard.verify._observer import Observer
from accumguard.verify.audit import _observe_loops, _precision, audit_device
from accumguard.verify.contract import AuditSetup, LoopContext
from accumguard.verify.reference import move_to, reference_run, windows_for_reference

K = 2


def build_model() -> torch.nn.Module:
    torch.manual_seed(5)
    return TokenMLP()


def make_optimizer(params):  # noqa: ANN001, ANN201
    return torch.optim.SGD(params, lr=0.3)


def batches(rank: int, world: int) -> list:
    return make_rank_batches(seed=2, world_size=world, micro_batches=4)[rank]


SETUP = AuditSetup(build_model=build_model, make_optimizer=make_optimizer, rank_batches=batches,
                   loss_fn=token_loss, accumulation_steps=K, count_fn=count_tokens)


@pytest.fixture
def fake_group(monkeypatch):  # noqa: ANN001, ANN201
    """A live process group of ``backend`` on a host with ``gpus`` visible GPUs."""

    def make(backend: str, gpus: int, rank: int, world: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: world)
        monkeypatch.delenv("LOCAL_RANK", raising=False)
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)

    return make


def test_loop_device_per_backend(fake_group, monkeypatch) -> None:  # noqa: ANN001
    fake_group("gloo", 1, 1, 2)  # gloo on a 1-GPU host: CPU ranks, rank 1 never on cuda:1
    assert audit_device() == torch.device("cpu")
    fake_group("nccl", 2, 1, 2)
    assert audit_device() == torch.device("cuda", 1)
    # torchrun: the local rank picks the GPU, not the global rank (2 nodes x 2 GPUs).
    fake_group("nccl", 2, 3, 4)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert audit_device() == torch.device("cuda", 1)
    fake_group("nccl", 1, 1, 2)
    with pytest.raises(ConfigError, match="seen 1 visible CUDA device"):
        audit_device()


def test_no_process_group_means_cpu() -> None:
    assert not dist.is_initialized()
    assert audit_device() == torch.device("cpu")


def _record(seen: list, ctx: LoopContext) -> None:
    seen.append({"device": ctx.device,
                 "param_device": next(ctx.model.parameters()).device,
                 "tf32": (torch.backends.cuda.matmul.allow_tf32,
                          torch.backends.cudnn.allow_tf32)})


@pytest.fixture
def tf32():  # noqa: ANN201
    """Set both TF32 flags with ``tf32(on)``; the previous values come back after the test
    (monkeypatch cannot: the cuBLAS flags are not plain attributes)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)

    def set_(on: bool) -> None:
        matmul.allow_tf32 = cudnn.allow_tf32 = on

    yield set_
    matmul.allow_tf32, cudnn.allow_tf32 = before


def test_audited_ranks_run_without_tf32_and_restore_it(tf32) -> None:  # noqa: ANN001
    import functools

    tf32(True)
    seen: list = []
    _observe_loops(0, 1, SETUP, ["a"], [functools.partial(_record, seen)], None, None,
                   torch.device("cpu"))
    assert seen == [{"device": torch.device("cpu"), "param_device": torch.device("cpu"),
                     "tf32": (False, False)}]
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (
        True, True)


def test_tf32_switched_on_by_a_cuda_loop_is_judged_as_fp16(tf32) -> None:  # noqa: ANN001
    """No GPU here: the context says cuda while the model stays on the CPU; only the
    observer's precision reading depends on ctx.device."""
    model = build_model()
    for on in (False, True):
        tf32(on)
        ctx = LoopContext(rank=0, world_size=1, setup=SETUP, model=model, batches=[],
                          device=torch.device("cuda", 0))
        obs = Observer(ctx, "x", None)
        with obs.installed():
            token_loss(model, batches(0, 1)[0])
        res = obs.result()
        compute, _, _, source = _precision(SETUP, res)
        assert compute == (torch.float16 if on else torch.float32), source
        assert ("TF32" in source) == on


def test_move_to_keeps_structure_and_dtypes() -> None:
    pair = collections.namedtuple("pair", "x n")
    batch = {"tokens": torch.ones(2, 3, dtype=torch.long),
             "parts": [torch.zeros(2), (torch.ones(1, dtype=torch.float16), "tag")],
             "p": pair(torch.ones(2), 3)}
    out = move_to(batch, "meta")
    assert out["tokens"].device.type == "meta" and out["tokens"].dtype == torch.long
    assert out["parts"][0].device.type == "meta" and out["parts"][1][1] == "tag"
    assert out["parts"][1][0].dtype == torch.float16
    assert isinstance(out["p"], pair) and out["p"].x.device.type == "meta" and out["p"].n == 3
    assert move_to(batch, "cpu")["tokens"] is batch["tokens"]  # no copy on the CPU path


def test_reference_is_cpu_float64_whatever_it_is_given() -> None:
    model = build_model()
    windows = windows_for_reference([batches(r, 2) for r in range(2)], K)
    run = reference_run(model, make_optimizer, windows, token_loss)
    for record in (run.initial, *run.params, *run.grads):
        for t in record.values():
            assert t.device.type == "cpu" and t.dtype == torch.float64
    assert next(model.parameters()).dtype == torch.float32  # the caller's model untouched
