"""DeepSpeed coalesced flush with ``lean_flush`` (the default): ZeRO-1/2 all-reduce the
contiguous reduce bucket in place instead of DeepSpeed's flattened copy; ZeRO-3 skips the
copy into the bucket that its reduce-scatter copies again; the ZeRO-1/2 step reads the
gradient partition as a view instead of a flattened copy. On the equivalence grid's
DeepSpeed case (K=4, 10 micro-batches per rank so the last window is partial, uneven
tokens, clipping at 0.1, AdamW) the parameters are bit-identical to DeepSpeed's own flush
after every step and match the fp64 reference; the fast path is really taken with the
default config, is not taken where the gradients are not one contiguous bucket
(ZeRO-2 ``contiguous_gradients: false``), and DeepSpeed's optimizer gets its attributes
back after every flush. On CPU the ZeRO-1/2 reduce bucket is kept from one flush to the
next (the same bits; an in-process test checks that a bucket still referenced elsewhere is
not reused)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from helpers import FP32_UPDATE_TOL, Case, make_data, make_model, make_optimizer, update_errors

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install "
                    "'accumguard[deepspeed]'); the DeepSpeed adapter tests need it")

pytestmark = pytest.mark.deepspeed

CASE = Case(accumulation_steps=4, micro_batches=10, optimizer="adamw", max_grad_norm=0.1,
            sync="deferred", seed=17)
# (ZeRO stage, extra zero_optimization keys, lean_flush); ZeRO-3 partitions every parameter
# (threshold 0) and keeps them for the window (window_memory="unsharded", the bench's row).
VARIANTS: list[tuple[int, dict[str, Any], bool]] = [
    (2, {}, True), (2, {}, False), (1, {}, True), (1, {}, False),
    (2, {"contiguous_gradients": False}, True),
    (3, {"stage3_param_persistence_threshold": 0}, True),
    (3, {"stage3_param_persistence_threshold": 0}, False)]


def _worker(rank: int, world: int) -> list[dict[str, Any]]:
    import deepspeed

    from accumguard import Accumulator
    from accumguard.demo.toy import count_tokens, token_loss
    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter
    from accumguard.verify.reference import flat_params

    deepspeed.init_distributed(dist_backend="gloo")
    runs = []
    for stage, zero, lean in VARIANTS:
        model = make_model(CASE)
        config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": stage, **zero},
                  "zero_allow_untested_optimizer": True,
                  "gradient_clipping": CASE.max_grad_norm, "steps_per_print": 10**9}
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=make_optimizer(CASE, model.parameters()), config=config)
        adapter = DeepSpeedEngineAdapter(engine, sync="deferred", lean_flush=lean,
                                         window_memory="unsharded" if stage == 3 else "sharded")
        acc = Accumulator(engine, None, accumulation_steps=CASE.accumulation_steps,
                          engine=adapter, max_grad_norm=CASE.max_grad_norm,
                          count_fn=count_tokens)
        snaps, flushes = [], []
        for window in acc.windows(make_data(CASE, world)[rank]):
            window.run(lambda b, e=engine: token_loss(e, b)[0])
            with deepspeed.zero.GatheredParameters(list(engine.module.parameters()),
                                                   enabled=stage == 3):
                snaps.append(flat_params(engine.module))
            flush = adapter.flush
            flushes.append(None if flush is None else (flush.in_place, flush.copied,
                                                       flush.step_views,
                                                       flush.pair_reductions,
                                                       flush.buckets_reused))
        opt = engine.optimizer
        from deepspeed.runtime.comm import coalesced_collectives as cc
        restored = ("allreduce_bucket" not in vars(opt) and
                    getattr(opt.flatten, "__name__", "") == "_flatten_dense_tensors"
                    and "setup_buckets" not in vars(opt)
                    and "_release_ipg_buffers" not in vars(opt)
                    if stage < 3 else opt.contiguous_gradients is True)
        # ZeRO-3's reduce-scatter function is DeepSpeed's own again after every flush
        restored = restored and cc._torch_reduce_scatter_fn.__module__ == cc.__name__
        runs.append({"stage": stage, "zero": zero, "lean": lean, "snaps": snaps,
                     "flushes": flushes, "described": adapter.describe(),
                     "restored": restored})
        acc.close()
    return runs


@pytest.fixture(scope="module")
def runs(deepspeed_spawn: dict[str, list[Any]]) -> list[dict[str, Any]]:
    # _worker runs in the session's shared DeepSpeed spawn (tests/ds_spawn.py)
    out: list[dict[str, Any]] = deepspeed_spawn["test_deepspeed_lean_flush"][0]
    return out


def _by(runs: list[dict[str, Any]], stage: int, lean: bool, zero: dict[str, Any] | None = None,
        ) -> dict[str, Any]:
    zero = zero if zero is not None else (
        {"stage3_param_persistence_threshold": 0} if stage == 3 else {})
    return next(r for r in runs if r["stage"] == stage and r["lean"] == lean
                and r["zero"] == zero)


def test_lean_flush_matches_the_reference_after_every_step(runs: list[dict[str, Any]]) -> None:
    assert len(runs) == len(VARIANTS)
    for r in runs:
        errors = update_errors(CASE, 2, r["snaps"])
        assert len(errors) == 3 and max(errors) <= FP32_UPDATE_TOL, (r["stage"], r["zero"],
                                                                     r["lean"], errors)


def test_lean_flush_is_bit_identical_to_deepspeeds_flush(runs: list[dict[str, Any]]) -> None:
    for stage in (1, 2, 3):
        fast, own = _by(runs, stage, True), _by(runs, stage, False)
        for a, b in zip(fast["snaps"], own["snaps"], strict=True):
            assert a.keys() == b.keys()
            assert all(torch.equal(a[k], b[k]) for k in a), stage


def test_fast_path_is_taken_only_where_it_applies(runs: list[dict[str, Any]]) -> None:
    for stage in (1, 2, 3):
        fast = _by(runs, stage, True)
        # Every window's flush avoided its copy (ZeRO-1/2: no flatten copy at all).
        avoided = [f[0] for f in fast["flushes"]]
        assert all(b > a for a, b in zip([0, *avoided], avoided, strict=False)), fast["flushes"]
        assert fast["flushes"][-1][1] == 0, fast["flushes"]
        # ZeRO-1/2: every step's gradient partition was read as a view, no flatten copy.
        assert [f[2] for f in fast["flushes"]] == ([1, 2, 3] if stage < 3 else [0, 0, 0])
        # ZeRO-3 on gloo, 2 ranks: every window's reduce-scatter ran as an all-reduce.
        pairs = [f[3] for f in fast["flushes"]]
        if stage == 3:
            assert all(b > a for a, b in zip([0, *pairs], pairs, strict=False)), pairs
        else:
            assert pairs == [0, 0, 0], pairs
        # ZeRO-1/2 on CPU: the reduce bucket of one flush is reused by the next (the first
        # allocates it); ZeRO-3's flush has no contiguous bucket.
        reused = [f[4] for f in fast["flushes"]]
        assert reused == ([0, 1, 2] if stage < 3 else [0, 0, 0]), reused
        assert "lean flush" in fast["described"] and fast["restored"], fast
        own = _by(runs, stage, False)
        assert own["flushes"] == [None] * 3 and "lean flush" not in own["described"]
    # Separate gradient tensors (no contiguous bucket): DeepSpeed's flatten copy stays.
    loose = _by(runs, 2, True, {"contiguous_gradients": False})
    assert loose["flushes"][-1][0] == 0 and loose["flushes"][-1][1] > 0, loose["flushes"]
    assert loose["flushes"][-1][4] == 0, loose["flushes"]  # no bucket to keep
    assert loose["restored"]


def test_adjacent_view_covers_exactly_the_pieces_torch_cat_would_copy() -> None:
    from accumguard.engines._deepspeed_flush import adjacent_view

    base = torch.arange(20.0)
    pieces = [base[3:7], base[7:8].view(1, 1), base[8:15]]
    view = adjacent_view(pieces)
    assert view is not None and torch.equal(view, torch.cat([p.reshape(-1) for p in pieces]))
    view.mul_(-1)  # a view: writing it writes the pieces (the in-place all-reduce)
    assert torch.equal(base[3:15], -torch.arange(3.0, 15.0)) and base[2] == 2 and base[15] == 15


def test_adjacent_view_refuses_what_is_not_one_run_of_memory() -> None:
    from accumguard.engines._deepspeed_flush import adjacent_view

    base = torch.arange(20.0)
    grid = torch.arange(16.0).view(4, 4)
    assert adjacent_view([]) is None
    assert adjacent_view([base[0:4], base[5:8]]) is None  # a gap
    assert adjacent_view([base[4:8], base[0:4]]) is None  # out of order
    assert adjacent_view([base[0:4], torch.arange(4.0)]) is None  # another storage
    assert adjacent_view([base[0:4], base[4:8].to(torch.float64)]) is None  # another dtype
    assert adjacent_view([grid[:, 0]]) is None  # not contiguous


class _Bucket:
    def __init__(self) -> None:
        self.buffer: list[torch.Tensor] = []
        self.index = 0
        self.elements = 0


class _FakeZero12:
    """What the kept bucket relies on of DeepSpeed 0.19.8's ZeRO-1/2 optimizer: setup_buckets
    allocates the bucket when the optimizer is not ready for gradients and contiguous_gradients
    is on; _release_ipg_buffers drops it at the end of the flush."""

    contiguous_gradients = True
    overlap_comm = False
    cpu_offload = False
    reduce_bucket_size = 64

    def __init__(self) -> None:
        self.ipg_buckets = {torch.float32: _Bucket()}
        self.ready_for_gradients = False
        self.allocated = 0

    def _gradient_reduction_buffer_dtype(self) -> torch.dtype:
        return torch.float32

    def setup_buckets(self) -> None:
        if not self.ready_for_gradients:
            if self.contiguous_gradients:
                for bucket in self.ipg_buckets.values():
                    bucket.buffer.clear()
                    bucket.buffer.append(torch.empty(self.reduce_bucket_size))
                    self.allocated += 1
            self.ready_for_gradients = True

    def _release_ipg_buffers(self) -> None:
        if self.contiguous_gradients:
            for bucket in self.ipg_buckets.values():
                bucket.buffer.clear()
        self.ready_for_gradients = False

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])

    def allreduce_bucket(self, bucket: list[torch.Tensor], *args: Any, **kwargs: Any,
                         ) -> torch.Tensor:
        return self.flatten(bucket)


def test_kept_bucket_is_reused_only_when_nothing_else_references_it() -> None:
    from accumguard.engines._deepspeed_flush import LeanFlush

    opt = _FakeZero12()
    lean = LeanFlush(opt, 2)
    held: list[torch.Tensor] = []

    def flush(value: float, hold: bool = False) -> torch.Tensor:
        with lean.active():
            opt.setup_buckets()
            buf = opt.ipg_buckets[torch.float32].buffer[0]
            buf[:8].fill_(value)  # the window's gradients, copied into the bucket
            if hold:
                held.append(buf[:8])  # e.g. a gradient tensor a user kept
            opt._release_ipg_buffers()
        return buf

    first = flush(1.0)
    assert (opt.allocated, lean.buckets_reused) == (1, 0)
    assert flush(2.0) is first and (opt.allocated, lean.buckets_reused) == (1, 1)
    flush(3.0, hold=True)
    assert flush(4.0) is not first and (opt.allocated, lean.buckets_reused) == (2, 2)
    assert torch.equal(held[0], torch.full((8,), 3.0))  # what it held is untouched
    assert "setup_buckets" not in vars(opt) and "_release_ipg_buffers" not in vars(opt)
    lean.release()
    flush(5.0)
    assert (opt.allocated, lean.buckets_reused) == (3, 2)
    opt.overlap_comm = True  # (the lean flush is off there; the kept bucket is too)
    flush(6.0)
    flush(7.0)
    assert (opt.allocated, lean.buckets_reused) == (5, 2)


def test_kept_bucket_falls_back_when_deepspeed_differs() -> None:
    """An optimizer without what the reuse rule reads (another DeepSpeed) gets DeepSpeed's own
    allocation, and nothing raises into the flush."""
    from accumguard.engines._deepspeed_flush import LeanFlush

    opt = _FakeZero12()
    lean = LeanFlush(opt, 2)

    def missing() -> torch.dtype:
        raise AttributeError("_gradient_reduction_buffer_dtype")

    opt._gradient_reduction_buffer_dtype = missing  # type: ignore[method-assign]
    for _ in range(3):
        with lean.active():
            opt.setup_buckets()
            opt._release_ipg_buffers()
    assert (opt.allocated, lean.buckets_reused) == (3, 0)
