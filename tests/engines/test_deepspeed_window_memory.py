"""DeepSpeed ZeRO-3 ``window_memory="unsharded"``: the equivalence grid's DeepSpeed case (K=4,
10 micro-batches per rank so the last window is partial, uneven tokens, clipping at 0.1,
AdamW) matches the fp64 reference after every step in both sync modes, with fewer
parameter all-gathers per window than the default; the persistence flags are restored.
The held micro-steps run without DeepSpeed's module hooks (``skip_idle_hooks``, the
default): bit-identical to the same window with the hooks, and the hooks are back after.
On gloo with 2 ranks the held window's parameter all-gathers run as one exchange of halves:
bit-identical to DeepSpeed's own all-gather.
Also the ZeRO-2 speed recipe (``contiguous_gradients: false``) on the same case."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import FP32_UPDATE_TOL, Case, make_data, make_model, make_optimizer, update_errors

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install "
                    "'accumguard[deepspeed]'); the DeepSpeed adapter tests need it")

pytestmark = pytest.mark.deepspeed

CASES = [Case(accumulation_steps=4, micro_batches=10, optimizer="adamw", max_grad_norm=0.1,
              sync=sync, seed=13) for sync in ("deferred", "eager")]


def _engine(case: Case, stage: int, **zero: Any) -> Any:
    import deepspeed

    model = make_model(case)
    opt = make_optimizer(case, model.parameters())
    config = {"train_micro_batch_size_per_gpu": 4,
              "gradient_accumulation_steps": 1 if case.sync == "deferred" else
              case.accumulation_steps,
              # threshold 0: every parameter of the (tiny) toy model is partitioned.
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                    **zero},
              "zero_allow_untested_optimizer": True, "gradient_clipping": case.max_grad_norm,
              "steps_per_print": 10**9}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


def _hook_keys(module: Any) -> list[tuple[list[int], list[int]]]:
    """Every submodule's forward pre-hook and forward hook ids, in order."""
    return [(list(m._forward_pre_hooks), list(m._forward_hooks)) for m in module.modules()]


def _worker(rank: int, world: int) -> dict[str, Any]:
    import deepspeed

    from accumguard import Accumulator
    from accumguard.core.errors import ConfigError
    from accumguard.demo.bench import _counting_ds_comm
    from accumguard.demo.toy import count_tokens, token_loss
    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter
    from accumguard.verify.reference import flat_params

    deepspeed.init_distributed(dist_backend="gloo")
    out: dict[str, Any] = {"runs": [], "errors": {}}
    # (stage, extra zero_optimization keys, window_memory): ZeRO-3 both memory modes, and
    # the ZeRO-2 recipe of docs/performance.md (contiguous_gradients false) on the same case.
    # A fourth: the unsharded window with DeepSpeed's module hooks in every micro-step.
    # A fifth: the unsharded window with DeepSpeed's own parameter all-gather (no 2-rank
    # exchange).
    variants = [(3, {}, "sharded", True), (3, {}, "unsharded", True),
                (2, {"contiguous_gradients": False}, "sharded", True),
                (3, {}, "unsharded", False), (3, {}, "unsharded", "no pair")]
    for case in CASES:
        for stage, zero, memory, skip in variants:
            engine = _engine(case, stage, **zero)
            hooks_before = _hook_keys(engine.module)
            adapter = DeepSpeedEngineAdapter(engine, sync=case.sync, window_memory=memory,
                                             skip_idle_hooks=bool(skip))
            if skip == "no pair":
                assert adapter.held is not None
                adapter.held.pair = False
            # The parameters' states when the window's last backward has ended (before the
            # flush): released, whoever released them (DeepSpeed's hooks or release_window).
            at_sync: list[list[str]] = []
            real_sync = adapter.sync

            def sync(real: Any = real_sync, seen: list[list[str]] = at_sync,
                     e: Any = engine) -> None:
                seen.append(sorted({p.ds_status.name for p in e.module.parameters()
                                    if hasattr(p, "ds_status")}))
                real()

            adapter.sync = sync  # type: ignore[method-assign]
            acc = Accumulator(engine, None, accumulation_steps=case.accumulation_steps,
                              engine=adapter, max_grad_norm=case.max_grad_norm,
                              count_fn=count_tokens)
            snaps, gathers = [], []
            for window in acc.windows(make_data(case, world)[rank]):
                counts: dict[str, list[int]] = {}
                with _counting_ds_comm(counts, min_bytes=0):
                    window.run(lambda b, e=engine: token_loss(e, b)[0])
                gathers.append(sum(c[0] for op, c in counts.items() if "gather" in op))
                with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
                    snaps.append(flat_params(engine.module))
            acc.close()
            persist = [bool(getattr(p, "ds_persist", False)) for p in engine.module.parameters()]
            out["runs"].append({"case": case, "stage": stage, "memory": memory, "snaps": snaps,
                                "gathers": gathers, "persist_after": persist,
                                "described": adapter.describe(), "skip": skip,
                                "skipped": adapter.held.skipped if adapter.held else 0,
                                "pair_gathers": (adapter.held.pair_gathers_done if adapter.held
                                                 else 0),
                                "window_gathers": (adapter.held.window_gathers if adapter.held
                                                   else 0),
                                "at_sync": at_sync,
                                "hooks_back": _hook_keys(engine.module) == hooks_before})
    for label, build in (("stage 2", lambda: DeepSpeedEngineAdapter(
            _engine(CASES[0], 2), sync="deferred", window_memory="unsharded")),
                         ("bad value", lambda: DeepSpeedEngineAdapter(
            _engine(CASES[0], 3), sync="deferred", window_memory="gathered"))):
        try:
            build()
        except ConfigError as err:
            out["errors"][label] = str(err)
    return out


@pytest.fixture(scope="module")
def results(deepspeed_spawn: dict[str, list[Any]]) -> dict[str, Any]:
    # _worker runs in the session's shared DeepSpeed spawn (tests/ds_spawn.py)
    out: dict[str, Any] = deepspeed_spawn["test_deepspeed_window_memory"][0]
    return out


def test_unsharded_window_matches_the_reference_after_every_step(results: dict) -> None:
    assert len(results["runs"]) == 10
    for r in results["runs"]:
        errors = update_errors(r["case"], 2, r["snaps"])
        assert max(errors) <= FP32_UPDATE_TOL, (r["stage"], r["case"].sync, r["memory"], errors)


def test_unsharded_window_gathers_less_and_restores_the_flags(results: dict) -> None:
    by = {(r["case"].sync, r["memory"]): r for r in results["runs"]
          if r["stage"] == 3 and r["skip"] is True}
    for sync in ("deferred", "eager"):
        sharded, unsharded = by[(sync, "sharded")], by[(sync, "unsharded")]
        # Window 0 traces the module order (DeepSpeed releases everything then); from window
        # 1 on the full windows (K=4) gather at least K times when sharded, and at most half
        # of that when the parameters are held for the window.
        for s, u in zip(sharded["gathers"][1:2], unsharded["gathers"][1:2], strict=True):
            assert s >= 4 and u <= s // 2, (sync, sharded["gathers"], unsharded["gathers"])
        assert not any(unsharded["persist_after"]), "ds_persist left set after close()"
        assert "window_memory=unsharded" in unsharded["described"]


def test_unsharded_window_is_refused_where_it_cannot_apply(results: dict) -> None:
    assert "ZeRO stage 3 only" in results["errors"]["stage 2"]
    assert "window_memory ('gathered') must be one of" in results["errors"]["bad value"]


def test_idle_hooks_skipped_bit_identical_and_put_back(results: dict) -> None:
    import torch

    for sync in ("deferred", "eager"):
        runs = {r["skip"]: r for r in results["runs"]
                if r["stage"] == 3 and r["memory"] == "unsharded" and r["case"].sync == sync
                and r["skip"] != "no pair"}
        fast, own = runs[True], runs[False]
        # Windows of 4, 4 and 2 micro-steps: micro-steps 1 and 2 of a full window are idle.
        assert fast["skipped"] >= 3 and own["skipped"] == 0, (sync, fast["skipped"])
        assert len(fast["snaps"]) == len(own["snaps"]) == 3
        for a, b in zip(fast["snaps"], own["snaps"], strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sync
        assert fast["hooks_back"] and own["hooks_back"]


def test_whole_window_without_hooks_gathers_once_and_releases(results: dict) -> None:
    """The held window's first and last micro-steps run without DeepSpeed's module hooks
    too: its parameters gathered in one call at the first micro-step (every window, the
    first included), released after the last backward as DeepSpeed's hooks release them
    (every parameter partitioned when the flush starts, as with the hooks). The updates are
    bit-identical to the hooks in every micro-step (test above)."""
    for sync in ("deferred", "eager"):
        runs = {r["skip"]: r for r in results["runs"]
                if r["stage"] == 3 and r["memory"] == "unsharded" and r["case"].sync == sync}
        fast, own = runs[True], runs[False]
        # Windows of 4, 4 and 2 micro-steps, every micro-step without the hooks.
        assert fast["window_gathers"] == 3 and fast["skipped"] == 10, (
            sync, fast["window_gathers"], fast["skipped"])
        assert own["window_gathers"] == 0
        for r in (fast, own, runs["no pair"]):
            assert r["at_sync"] == [["NOT_AVAILABLE"]] * 3, (sync, r["skip"], r["at_sync"])


def test_parameter_gathers_by_exchange_bit_identical(results: dict) -> None:
    """gloo, 2 ranks: the held window's parameter all-gathers served by one exchange of
    halves (``_pair.all_gather_pair``) give the same parameters, bit for bit, as DeepSpeed's
    own all-gather, and are really taken (at least one per window)."""
    import torch

    for sync in ("deferred", "eager"):
        runs = {r["skip"]: r for r in results["runs"]
                if r["stage"] == 3 and r["memory"] == "unsharded" and r["case"].sync == sync}
        fast, own = runs[True], runs["no pair"]
        assert fast["pair_gathers"] >= 3 and own["pair_gathers"] == 0, (
            sync, fast["pair_gathers"], own["pair_gathers"])
        assert len(fast["snaps"]) == len(own["snaps"]) == 3
        for a, b in zip(fast["snaps"], own["snaps"], strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sync
