"""DeepSpeed optimizer wrappers without ``coalesce_grad_reduction`` (BF16_Optimizer: bf16 with
fp32 gradient accumulation, the fix the AG204 warning recommends): deferred mode is never
chosen for them. With config GA 1 the Accumulator refuses up front with the fix (GA = K);
with GA = K it drives the engine's native accumulation (eager) and trains. Before, it chose
deferred and failed at the first micro-step with DeepSpeed's NotImplementedError."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
import torch

from accumguard import Accumulator
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.deepspeed

K = 2
CASES = [(1, 1, "auto"), (1, K, "auto"), (1, 1, "deferred"), (2, 1, "auto")]  # stage, GA, sync


def _run(rank: int, world: int) -> list[tuple[Any, ...]]:
    import deepspeed

    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter

    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    out: list[tuple[Any, ...]] = []
    for stage, ga, sync in CASES:
        torch.manual_seed(0)
        model = TokenMLP()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ga,
               "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
               "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
               "gradient_clipping": 0.0, "steps_per_print": 10**9}
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
        wrapper = type(engine.optimizer).__name__
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                acc = Accumulator(engine, None, accumulation_steps=K, count_fn=count_tokens,
                                  engine=DeepSpeedEngineAdapter(engine, sync=sync))
                data = make_rank_batches(seed=0, world_size=world, micro_batches=2 * K)[rank]
                for w in acc.windows(data):
                    w.run(lambda b, e=engine: token_loss(e, b)[0])
            finite = all(bool(torch.isfinite(p).all()) for p in engine.module.parameters())
            out.append((wrapper, "ran", acc.engine.sync_mode, acc.optimizer_steps, finite))
        except Exception as err:  # noqa: BLE001 - the outcome is what is tested
            out.append((wrapper, type(err).__name__, str(err)))
    return out


def test_wrappers_without_coalescing_are_never_deferred(
        deepspeed_spawn: dict[str, list[Any]]) -> None:
    # _run runs in the session's shared DeepSpeed spawn (tests/ds_spawn.py)
    results = deepspeed_spawn["test_deepspeed_wrappers"]
    for per_rank in zip(*results, strict=True):
        assert per_rank[0][:2] == per_rank[1][:2]
    bf16_ga1, bf16_gak, bf16_deferred, zero2 = results[0]
    assert bf16_ga1[:2] == ("BF16_Optimizer", "ConfigError")
    assert "does not support it" in bf16_ga1[2]
    assert f'"gradient_accumulation_steps": {K}' in bf16_ga1[2]
    assert bf16_gak == ("BF16_Optimizer", "ran", "eager", 2, True)
    assert bf16_deferred[:2] == ("BF16_Optimizer", "ConfigError")
    assert "sync='eager'" in bf16_deferred[2]
    # A wrapper that supports it still gets the coalesced (deferred) mode by default.
    assert zero2 == ("DeepSpeedZeroOptimizer", "ran", "deferred", 2, True)
