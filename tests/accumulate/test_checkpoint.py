"""Checkpoint at a boundary, resume in FRESH processes, continue: bit-for-bit the
uninterrupted run (DDP and FSDP2 via torch distributed checkpoint, DeepSpeed ZeRO-1/2/3
via save_checkpoint(client_state=...)). Momentum (optimizer state), a decaying scheduler
and the Accumulator's counters must all come back. A mid-window checkpoint, another K and
another world size are refused with the fix."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
import torch

from accumguard import Accumulator, ConfigError, UsageError
from accumguard.accumulate.checkpoint import load_checkpoint, save_checkpoint
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss

from helpers import cpu_mesh

K = 2
WINDOWS = 4
SAVE_AFTER = 2  # windows


def _build(engine: str, k: int = K) -> tuple[Any, Accumulator, Any]:
    torch.manual_seed(0)
    model: Any = TokenMLP()
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
    elif engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        mesh = cpu_mesh()  # explicit: FSDP2's default mesh is CUDA whenever CUDA is visible
        for sub in (model.embed, model.fc1, model.fc2):
            fully_shard(sub, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    acc = Accumulator(model, opt, accumulation_steps=k, scheduler=sched, count_fn=count_tokens,
                      max_grad_norm=1.0)
    return model, acc, sched


def _build_ds(stage: int, k: int = K) -> tuple[Any, Accumulator, Any]:
    import deepspeed

    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
           "gradient_clipping": 1.0, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    acc = Accumulator(engine, None, accumulation_steps=k, scheduler=sched,
                      count_fn=count_tokens, max_grad_norm=1.0)
    return engine, acc, sched


def _params(model: Any, stage: int | None = None) -> list[torch.Tensor]:
    if stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.module.parameters())):
            return [p.detach().clone() for p in model.module.parameters()]
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for p in model.parameters()]


def _train(acc: Accumulator, model: Any, data: list[Any], windows: int | None = None) -> None:
    for w in acc.windows(data):
        w.run(lambda b: token_loss(model, b)[0])
        if windows is not None and acc.windows_seen == windows:
            return


def _data(rank: int, world: int) -> list[Any]:
    return make_rank_batches(seed=5, world_size=world, micro_batches=WINDOWS * K)[rank]


def _first_run(rank: int, world: int, root: str, kinds: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in kinds:
        stage = int(kind[-1]) if kind.startswith("zero") else None
        model, acc, sched = _build_ds(stage) if stage is not None else _build(kind)
        data = _data(rank, world)
        # A checkpoint in the middle of a window is refused, with the fix.
        window = next(acc.windows(data))
        with next(iter(window)) as micro:
            micro.backward(token_loss(model, micro.batch)[0])
        try:
            save_checkpoint(f"{root}/{kind}-bad", acc)
            out[f"{kind}-midwindow"] = "saved"
        except UsageError as err:
            out[f"{kind}-midwindow"] = str(err)
        for micro in list(window)[1:]:
            with micro:
                micro.backward(token_loss(model, micro.batch)[0])
        # Train to the checkpoint (the first window is done), save, go on uninterrupted.
        _train(acc, model, data[K:], SAVE_AFTER)
        save_checkpoint(f"{root}/{kind}", acc)
        _train(acc, model, data[acc.micro_batches_consumed:])
        out[kind] = {"params": _params(model, stage), "steps": acc.optimizer_steps,
                     "lr": sched.get_last_lr()}
        acc.close()
    return out


def _resume(rank: int, world: int, root: str, kinds: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in kinds:
        stage = int(kind[-1]) if kind.startswith("zero") else None
        model, acc, sched = _build_ds(stage) if stage is not None else _build(kind)
        state = load_checkpoint(f"{root}/{kind}", acc)
        data = _data(rank, world)[state["micro_batches_consumed"]:]
        _train(acc, model, data)
        out[kind] = {"params": _params(model, stage), "steps": acc.optimizer_steps,
                     "lr": sched.get_last_lr(), "consumed": state["micro_batches_consumed"]}
        acc.close()
        # Another K is refused before anything is overwritten.
        _, other, _ = _build_ds(stage, k=K + 1) if stage is not None else _build(kind, K + 1)
        try:
            load_checkpoint(f"{root}/{kind}", other)
            out[f"{kind}-otherk"] = "loaded"
        except ConfigError as err:
            out[f"{kind}-otherk"] = str(err)
        other.close()
    return out


def _first_then_resume(rank: int, world: int, root: str,
                       kinds: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first run, then the resumed one, in the same ranks: the resume builds a new
    model, optimizer and Accumulator and reads everything from the checkpoint files (what a
    restarted process would do), without paying for a second spawn and DeepSpeed start-up."""
    if any(k.startswith("zero") for k in kinds):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _first_run(rank, world, root, kinds), _resume(rank, world, root, kinds)


def _check(first: list[dict[str, Any]], resumed: list[dict[str, Any]], kinds: list[str]) -> None:
    for rank, (a, b) in enumerate(zip(first, resumed, strict=True)):
        for kind in kinds:
            assert "expected a boundary" in a[f"{kind}-midwindow"], a[f"{kind}-midwindow"]
            assert "changes the effective batch" in b[f"{kind}-otherk"], b[f"{kind}-otherk"]
            assert b[kind]["consumed"] == SAVE_AFTER * K
            assert a[kind]["steps"] == b[kind]["steps"] == WINDOWS, (kind, a[kind], b[kind])
            assert a[kind]["lr"] == b[kind]["lr"], kind
            for x, y in zip(a[kind]["params"], b[kind]["params"], strict=True):
                assert torch.equal(x, y), f"{kind} rank {rank}: resumed run differs"


KINDS = ["ddp", "fsdp2", "zero1", "zero2", "zero3"]


def _shared(rank: int, world: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """This module's worker in the session's shared DeepSpeed spawn (tests/ds_spawn.py):
    rank 0's fresh checkpoint directory, shared with rank 1, then :func:`_first_then_resume`
    over every engine; the directory is removed afterwards."""
    import shutil
    import tempfile

    import torch.distributed as dist

    box = [tempfile.mkdtemp(prefix="accumguard-ckpt-") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    try:
        return _first_then_resume(rank, world, str(box[0]), KINDS)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(str(box[0]), ignore_errors=True)


@pytest.fixture(scope="module")
def runs(deepspeed_spawn: dict[str, list[Any]]) -> tuple[list[Any], list[Any]]:
    """Every engine's first run and resume in the 2 ranks of the session's shared DeepSpeed
    spawn (DDP, FSDP2, ZeRO 1-3; it was a spawn of its own, paying DeepSpeed's import again)."""
    out = deepspeed_spawn["test_checkpoint"]
    return [first for first, _ in out], [resumed for _, resumed in out]


def test_ddp_and_fsdp2_resume_bitwise(runs: tuple[list[Any], list[Any]]) -> None:
    _check(*runs, ["ddp", "fsdp2"])


@pytest.mark.deepspeed
def test_deepspeed_resume_bitwise(runs: tuple[list[Any], list[Any]]) -> None:
    _check(*runs, ["zero1", "zero2", "zero3"])


def test_another_world_size_is_refused() -> None:
    torch.manual_seed(0)
    model = TokenMLP()
    acc = Accumulator(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=K)
    state = {**acc.state_dict(), "world_size": 2}
    with pytest.raises(ConfigError, match=r"written by 2 ranks but this run has 1.*Resume on 2"):
        acc.load_state_dict(state)


def test_zero_redundancy_optimizer_is_refused_with_the_manual_recipe() -> None:
    from accumguard.accumulate import checkpoint

    class FakeEngine:
        name = "zero1"
        owns_optimizer = False

    class FakeAcc:
        engine = FakeEngine()

    with pytest.raises(ConfigError, match="consolidate_state_dict"):
        checkpoint._check_optimizer(FakeAcc())  # type: ignore[arg-type]
