"""DeepSpeed ZeRO-1/2 coalesced flush with ``reduce_in_place`` (the default): the reduce
bucket is all-reduced in place instead of through DeepSpeed's flattened copy. On the
equivalence grid's DeepSpeed case (K=4, 10 micro-batches per rank so the last window is
partial, uneven tokens, clipping at 0.1, AdamW) the parameters are bit-identical to
DeepSpeed's own flush after every step and match the fp64 reference; the fast path is
really taken with the default config, is not taken where the gradients are not one
contiguous bucket (``contiguous_gradients: false``), and DeepSpeed's optimizer gets its
attributes back after every flush."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from accumguard import run_on_ranks

from helpers import FP32_UPDATE_TOL, Case, make_data, make_model, make_optimizer, update_errors

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install "
                    "'accumguard[deepspeed]'); the DeepSpeed adapter tests need it")

pytestmark = pytest.mark.deepspeed

CASE = Case(accumulation_steps=4, micro_batches=10, optimizer="adamw", max_grad_norm=0.1,
            sync="deferred", seed=17)
# (ZeRO stage, extra zero_optimization keys, reduce_in_place)
VARIANTS = [(2, {}, True), (2, {}, False), (1, {}, True), (1, {}, False),
            (2, {"contiguous_gradients": False}, True)]


def _worker(rank: int, world: int) -> list[dict[str, Any]]:
    import deepspeed

    from accumguard import Accumulator
    from accumguard.demo.toy import count_tokens, token_loss
    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter
    from accumguard.verify.reference import flat_params

    deepspeed.init_distributed(dist_backend="gloo")
    runs = []
    for stage, zero, in_place in VARIANTS:
        model = make_model(CASE)
        config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": stage, **zero},
                  "zero_allow_untested_optimizer": True,
                  "gradient_clipping": CASE.max_grad_norm, "steps_per_print": 10**9}
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=make_optimizer(CASE, model.parameters()), config=config)
        adapter = DeepSpeedEngineAdapter(engine, sync="deferred", reduce_in_place=in_place)
        acc = Accumulator(engine, None, accumulation_steps=CASE.accumulation_steps,
                          engine=adapter, max_grad_norm=CASE.max_grad_norm,
                          count_fn=count_tokens)
        snaps, flushes = [], []
        for window in acc.windows(make_data(CASE, world)[rank]):
            window.run(lambda b, e=engine: token_loss(e, b)[0])
            snaps.append(flat_params(engine.module))
            flush = adapter.in_place_flush
            flushes.append(None if flush is None else (flush.in_place, flush.copied))
        opt = engine.optimizer
        runs.append({"stage": stage, "zero": zero, "in_place": in_place, "snaps": snaps,
                     "flushes": flushes, "described": adapter.describe(),
                     "restored": "allreduce_bucket" not in vars(opt) and
                     getattr(opt.flatten, "__name__", "") == "_flatten_dense_tensors"})
        acc.close()
    return runs


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return run_on_ranks(_worker, 2, timeout=600)[0]


def _by(runs: list[dict[str, Any]], stage: int, in_place: bool, zero: dict[str, Any] | None = None,
        ) -> dict[str, Any]:
    return next(r for r in runs if r["stage"] == stage and r["in_place"] == in_place
                and r["zero"] == (zero or {}))


def test_in_place_flush_matches_the_reference_after_every_step(runs: list[dict[str, Any]]) -> None:
    assert len(runs) == len(VARIANTS)
    for r in runs:
        errors = update_errors(CASE, 2, r["snaps"])
        assert len(errors) == 3 and max(errors) <= FP32_UPDATE_TOL, (r["stage"], r["zero"],
                                                                     r["in_place"], errors)


def test_in_place_flush_is_bit_identical_to_deepspeeds_flush(runs: list[dict[str, Any]]) -> None:
    for stage in (1, 2):
        fast, own = _by(runs, stage, True), _by(runs, stage, False)
        for a, b in zip(fast["snaps"], own["snaps"], strict=True):
            assert a.keys() == b.keys()
            assert all(torch.equal(a[k], b[k]) for k in a), stage


def test_fast_path_is_taken_only_where_it_applies(runs: list[dict[str, Any]]) -> None:
    for stage in (1, 2):
        fast = _by(runs, stage, True)
        # Every window's flush all-reduced the bucket in place (no flatten copy at all).
        ins = [f[0] for f in fast["flushes"]]
        assert all(b > a for a, b in zip([0, *ins], ins, strict=False)), fast["flushes"]
        assert fast["flushes"][-1][1] == 0, fast["flushes"]
        assert "reduce in place" in fast["described"] and fast["restored"]
        own = _by(runs, stage, False)
        assert own["flushes"] == [None] * 3 and "reduce in place" not in own["described"]
    # Separate gradient tensors (no contiguous bucket): DeepSpeed's flatten copy stays.
    loose = _by(runs, 2, True, {"contiguous_gradients": False})
    assert loose["flushes"][-1][0] == 0 and loose["flushes"][-1][1] > 0, loose["flushes"]
    assert loose["restored"]
