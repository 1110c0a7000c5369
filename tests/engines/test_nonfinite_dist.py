"""The non-finite policy on 2 real gloo ranks: DDP (deferred, eager), ZeRO-1, FSDP2
(deferred, eager; with and without clipping) and DeepSpeed ZeRO 0-3.

A NaN/Inf in ONE micro-step of ONE rank must skip that window on BOTH ranks (no optimizer
step, scheduler held, gradients discarded), leave every parameter finite and tell the user
on every rank (a warning naming the rank, the window and the micro-step). "Skipped" is
checked exactly: both ranks end bit-for-bit equal to the same run with that window's data
removed on every rank. Everything is swept inside one spawn per engine family.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch

from accumguard import AccumguardWarning, Accumulator, run_on_ranks
from accumguard.core.errors import NonFiniteError
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss

from helpers import cpu_mesh

K = 2
WINDOWS = 3
BAD_WINDOW, BAD_MICRO, BAD_RANK = 1, 1, 1

# (engine, sync, max_grad_norm, kind): kind "nan"/"inf" poisons the loss; "grad" keeps the
# loss finite and makes one parameter's gradient NaN on rank 1 only (on FSDP2 it then lands
# in one rank's shard only: the check must still be global).
TORCH_CASES = [
    ("ddp", "deferred", None, "nan"),
    ("ddp", "eager", 1.0, "inf"),
    ("ddp", "deferred", None, "grad"),
    ("zero1", "deferred", None, "nan"),
    ("fsdp2", "deferred", None, "nan"),
    ("fsdp2", "eager", 1.0, "nan"),
    ("fsdp2", "deferred", None, "grad"),
    ("fsdp2", "eager", None, "grad"),
]


def _poisoned(model: torch.nn.Module, batch: Any, kind: str | None) -> torch.Tensor:
    if kind == "grad":
        # A finite loss (sqrt(0) = 0) whose gradient is NaN (d sqrt/du at 0 is inf, × 0). It
        # goes through the forward's output: touching a sharded parameter outside the forward
        # would run DTensor collectives on this rank only.
        logits = model(batch["tokens"])
        labels = batch["labels"]
        s = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                              labels.reshape(-1), ignore_index=-100,
                                              reduction="sum")
        return s + torch.sqrt((logits * 0).sum())
    s, _ = token_loss(model, batch)
    if kind == "nan":
        return s * math.nan
    if kind == "inf":
        return s + math.inf
    return s


def _full(model: torch.nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for p in model.parameters()]


def _build(engine: str, sync: str) -> tuple[torch.nn.Module, Any, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model: Any = TokenMLP()
    if engine in ("ddp", "zero1"):
        model = DDP(model)
    if engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        mesh = cpu_mesh()  # gloo ranks: FSDP2's default mesh is CUDA if CUDA is visible
        for sub in (model.embed, model.fc1, model.fc2):
            fully_shard(sub, mesh=mesh)
        fully_shard(model, mesh=mesh)
    if engine == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt: Any = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                           lr=0.3, momentum=0.9)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    from accumguard.engines.registry import resolve_engine

    adapter = resolve_engine(model, opt, engine, sync=sync)
    return model, opt, adapter


def _train(rank: int, world: int, engine: str, sync: str, clip: float | None,
           kind: str | None, drop_bad_window: bool, nonfinite: str = "skip") -> dict[str, Any]:
    model, opt, adapter = _build(engine, sync)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    acc = Accumulator(model, opt, accumulation_steps=K, engine=adapter, scheduler=sched,
                      max_grad_norm=clip, count_fn=count_tokens, nonfinite=nonfinite)  # type: ignore[arg-type]
    data = make_rank_batches(seed=3, world_size=world, micro_batches=WINDOWS * K)[rank]
    if drop_bad_window:
        del data[BAD_WINDOW * K:(BAD_WINDOW + 1) * K]
    raised: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for w in acc.windows(data):
            try:
                for micro in w:
                    hit = (rank, w.index, micro.index) == (BAD_RANK, BAD_WINDOW, BAD_MICRO)
                    with micro:
                        micro.backward(_poisoned(model, micro.batch, kind if hit else None))
            except NonFiniteError as err:
                raised.append(f"{err.window}:{sorted(err.ranks.items())}:{err}")
    acc.close()
    params = _full(model)
    return {
        "params": params,
        "finite": all(bool(torch.isfinite(p).all()) for p in params),
        "skipped": [r.skipped for r in acc.history],
        "reasons": [r.skip_reason for r in acc.history],
        "steps": acc.optimizer_steps,
        "lr": opt.param_groups[0]["lr"],
        "warnings": [str(c.message) for c in caught if issubclass(c.category, AccumguardWarning)],
        "raised": raised,
    }


def _torch_sweep(rank: int, world: int) -> list[dict[str, Any]]:
    out = []
    for engine, sync, clip, kind in TORCH_CASES:
        out.append({"bad": _train(rank, world, engine, sync, clip, kind, False),
                    "clean": _train(rank, world, engine, sync, clip, None, True)})
    # nonfinite="raise": every rank raises for the same window, and training goes on.
    out.append({"raise": _train(rank, world, "ddp", "deferred", None, "nan", False, "raise")})
    out.append({"raise": _train(rank, world, "fsdp2", "deferred", None, "grad", False,
                                "raise")})
    out.append({"fsdp2_shard": _fsdp2_one_bad_shard(rank)})
    return out


def _fsdp2_one_bad_shard(rank: int) -> list[bool]:
    """A NaN in the shard of ONE rank (what a gradient corrupted in one element looks like
    after the reduce-scatter): the check without clipping must still agree on every rank."""
    model, opt, adapter = _build("fsdp2", "deferred")
    data = make_rank_batches(seed=3, world_size=2, micro_batches=1)[rank]
    token_loss(model, data[0])[0].backward()
    seen = [bool(adapter.nonfinite_grads(None))]
    if rank == 1:
        with torch.no_grad():
            next(model.parameters()).grad.to_local().view(-1)[0] = math.nan
    seen.append(bool(adapter.nonfinite_grads(None)))
    adapter.close()
    return seen


@pytest.fixture(scope="module")
def torch_results() -> list[list[dict[str, Any]]]:
    return run_on_ranks(_torch_sweep, 2, timeout=300)


def _check_skipped_everywhere(per_rank: list[dict[str, Any]], label: str, kind: str) -> None:
    bad = [r["bad"] for r in per_rank]
    clean = [r["clean"] for r in per_rank]
    for rank, (b, c) in enumerate(zip(bad, clean, strict=True)):
        assert b["finite"], f"{label}: rank {rank} has non-finite parameters"
        assert b["skipped"] == [i == BAD_WINDOW for i in range(WINDOWS)], (label, rank, b)
        assert b["steps"] == WINDOWS - 1 and b["lr"] == c["lr"], label  # scheduler held
        for x, y in zip(b["params"], c["params"], strict=True):
            assert torch.equal(x, y), f"{label}: rank {rank} differs from the run without it"
        assert len(b["warnings"]) == 1, (label, rank, b["warnings"])
        msg = b["warnings"][0]
        assert f"window {BAD_WINDOW} skipped on every rank" in msg, msg
        if kind == "grad":
            assert "reduced gradient holds NaN/Inf" in msg, msg
        else:
            assert f"rank {BAD_RANK} micro-step {BAD_MICRO}" in msg, msg
        assert msg.startswith(f"[rank {rank}] "), msg
    for x, y in zip(bad[0]["params"], bad[1]["params"], strict=True):
        assert x.shape == y.shape and torch.equal(x, y), f"{label}: ranks disagree"


@pytest.mark.parametrize("index", range(len(TORCH_CASES)),
                         ids=[f"{e}-{s}-clip{c}-{k}" for e, s, c, k in TORCH_CASES])
def test_one_bad_rank_skips_the_window_on_every_rank(torch_results: list, index: int) -> None:
    engine, sync, clip, kind = TORCH_CASES[index]
    _check_skipped_everywhere([r[index] for r in torch_results], f"{engine}/{sync}/{clip}",
                              kind)


def test_fsdp2_check_is_global_without_clipping(torch_results: list) -> None:
    assert [r[-1]["fsdp2_shard"] for r in torch_results] == [[False, True], [False, True]]


def test_raise_mode_raises_on_every_rank(torch_results: list) -> None:
    for offset, expect_ranks in ((0, "[(1, 1)]"), (1, "[]")):
        per_rank = [r[len(TORCH_CASES) + offset]["raise"] for r in torch_results]
        for rank, res in enumerate(per_rank):
            assert len(res["raised"]) == 1, (offset, rank, res)
            assert res["raised"][0].startswith(f"{BAD_WINDOW}:{expect_ranks}:"), res["raised"]
            assert res["skipped"] == [i == BAD_WINDOW for i in range(WINDOWS)]
            assert res["finite"] and res["warnings"] == []


# ---------------------------------------------------------------------------- DeepSpeed
DS_CASES = [(0, 2), (1, 1), (2, 1), (2, 2), (3, 1)]  # (ZeRO stage, config GA: 1 deferred, K eager)


def _ds_train(rank: int, world: int, stage: int, ga: int, kind: str | None,
              drop: bool) -> dict[str, Any]:
    import deepspeed

    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ga,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
           "gradient_clipping": 0.0, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    acc = Accumulator(engine, None, accumulation_steps=K, scheduler=sched, count_fn=count_tokens)
    data = make_rank_batches(seed=3, world_size=world, micro_batches=WINDOWS * K)[rank]
    if drop:
        del data[BAD_WINDOW * K:(BAD_WINDOW + 1) * K]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for w in acc.windows(data):
            for micro in w:
                hit = (rank, w.index, micro.index) == (BAD_RANK, BAD_WINDOW, BAD_MICRO)
                with micro:
                    micro.backward(_poisoned(engine, micro.batch, kind if hit else None))
    if stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            params = [p.detach().clone() for p in engine.module.parameters()]
    else:
        params = [p.detach().clone() for p in engine.module.parameters()]
    acc.close()
    return {
        "params": params,
        "finite": all(bool(torch.isfinite(p).all()) for p in params),
        "skipped": [r.skipped for r in acc.history],
        "reasons": [r.skip_reason for r in acc.history],
        "steps": acc.optimizer_steps,
        "lr": opt.param_groups[0]["lr"],
        "warnings": [str(c.message) for c in caught if issubclass(c.category, AccumguardWarning)
                     and "skipped on every rank" in str(c.message)],
    }


def _ds_sweep(rank: int, world: int) -> list[dict[str, Any]]:
    import logging

    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    return [{"bad": _ds_train(rank, world, stage, ga, "nan", False),
             "clean": _ds_train(rank, world, stage, ga, None, True)} for stage, ga in DS_CASES]


@pytest.fixture(scope="module")
def ds_results(deepspeed_spawn: dict[str, list[Any]]) -> list[list[dict[str, Any]]]:
    # _ds_sweep runs in the session's shared DeepSpeed spawn (tests/ds_spawn.py)
    out: list[list[dict[str, Any]]] = deepspeed_spawn["test_nonfinite_dist"]
    return out


@pytest.mark.deepspeed
@pytest.mark.parametrize("index", range(len(DS_CASES)),
                         ids=[f"zero{s}-ga{g}" for s, g in DS_CASES])
def test_deepspeed_skip_is_read_back_and_reported(ds_results: list, index: int) -> None:
    stage, _ = DS_CASES[index]
    per_rank = [r[index] for r in ds_results]
    _check_skipped_everywhere(per_rank, f"deepspeed zero{stage}", "nan")
    if stage > 0:  # the engine itself skipped the step: its own words are in the reason
        reason = per_rank[0]["bad"]["reasons"][BAD_WINDOW]
        assert "non-finite loss" in reason
