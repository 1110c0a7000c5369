"""FSDP2's unsharded window, fast path against the path without it, on 2 real gloo ranks.

The fast path (``FSDP2Engine`` defaults): idle micro-steps without the non-root modules'
forward hooks (``skip_idle_hooks``, :mod:`accumguard.engines._fsdp2_window`), FSDP2's
forward order cleared before a window's last micro-step, and the reduce-scatter served by an
exchange of halves on gloo with 2 ranks, and so its all-gathers (``pair_all_reduce``). Each
must give the same bits as the adapter without it: ``torch.equal`` on every parameter after every optimizer step, for
deferred and eager windows, a partial last window, clipping, the sharded window (where only the
exchanges apply), and a MixedPrecisionPolicy with
an fp32 ``reduce_dtype`` (where the adapter keeps the hooks: the policy casts). The tests
also check that the fast path is really taken, that the hooks are back in their modules in
their order afterwards, and that when FSDP2's hook handles are not where torch 2.13 keeps
them the window runs with its hooks (the correct, slower path) and still gives the same bits.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from helpers import Case, cpu_mesh, engine_cases, make_data, make_model, train_with_accumulator

CASES = engine_cases(41)
CASE = CASES[0]  # K = 4, 10 micro-batches (4 + 4 + 2), uneven sizes, clipping 0.2, AdamW
NO_CLIP = CASES[2]  # K = 4, 9 micro-batches (4 + 4 + 1), no clipping, SGD


def _shard(case: Case, mp: object = None) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = make_model(case)
    mesh = cpu_mesh()
    kw = {} if mp is None else {"mp_policy": mp}
    for sub in (model.embed, model.fc1, model.fc2):
        fully_shard(sub, reshard_after_forward=False, mesh=mesh, **kw)
    fully_shard(model, reshard_after_forward=False, mesh=mesh, **kw)
    return model


def _hooks(model: torch.nn.Module) -> list:
    """Every module's forward hook dictionaries, ids and functions in order."""
    return [(name, list(m._forward_pre_hooks.items()), list(m._forward_hooks.items()))
            for name, m in model.named_modules()]


def _run(case: Case, world: int, rank: int, *, fast: bool, mp: object = None,
         break_handles: bool = False, memory: str = "unsharded") -> dict:
    from accumguard.engines.fsdp2 import FSDP2Engine

    model = _shard(case, mp)
    if break_handles:  # a torch that keeps FSDP2's hook handles elsewhere
        for m in (model.embed, model.fc1, model.fc2):
            del m._get_fsdp_state()._pre_forward_hook_handle
    hooks_before = _hooks(model)
    engine = FSDP2Engine(model, sync=case.sync, window_memory=memory,  # type: ignore[arg-type]
                         skip_idle_hooks=fast, pair_all_reduce=fast)
    snaps, _, acc = train_with_accumulator(case, model, engine, make_data(case, world)[rank])
    out = {"snaps": snaps, "steps": acc.optimizer_steps,
           "skipped": engine.idle_hooks.skipped if engine.idle_hooks else 0,
           "pair_calls": sum(c.calls for c in engine._pair_comms),
           "pair_gathers": sum(c.calls for c in engine._pair_gathers),
           "all_gathers": engine.all_gathers, "windows": acc.windows_seen,
           "hooks_back": _hooks(model) == hooks_before}
    acc.close()
    return out


def _grid(rank: int, world: int) -> dict:
    import warnings

    from torch.distributed.fsdp import MixedPrecisionPolicy

    warnings.filterwarnings("ignore", message=".*returned a view tensor")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    out: dict = {}
    for label, case, kw in (
            ("deferred", CASE.with_(sync="deferred"), {}),
            ("deferred-noclip", NO_CLIP.with_(sync="deferred"), {}),
            ("eager", CASE.with_(sync="eager"), {}),
            ("mixed", CASE.with_(sync="deferred"), {"mp": mp}),
            ("no-handles", CASE.with_(sync="deferred"), {"break_handles": True}),
            # window_memory="sharded": only the 2-rank all-reduce applies
            ("sharded", CASE.with_(sync="deferred"), {"memory": "sharded"})):
        for fast in (True, False):
            out[(label, fast)] = _run(case, world, rank, fast=fast, **kw)
    return out


@pytest.fixture(scope="module")
def results(torch_spawn: dict[str, list[Any]]) -> dict:
    """Rank 0 of ``_grid``, run in the session's shared gloo spawn
    (``ds_spawn.TORCH_WORKERS``)."""
    out: dict = torch_spawn["test_fsdp2_fast_window"][0]
    return out


def _same_bits(a: dict, b: dict) -> bool:
    return (len(a["snaps"]) == len(b["snaps"]) > 0 and
            all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                for x, y in zip(a["snaps"], b["snaps"], strict=True)))


@pytest.mark.parametrize("label", ["deferred", "deferred-noclip", "eager", "mixed",
                                   "no-handles", "sharded"])
def test_fast_window_bit_identical(results: dict, label: str) -> None:
    fast, slow = results[(label, True)], results[(label, False)]
    assert fast["steps"] == slow["steps"] == 3
    assert _same_bits(fast, slow), label
    assert fast["hooks_back"] and slow["hooks_back"], label


def test_fast_path_taken_where_it_applies(results: dict) -> None:
    # Windows of 4, 4 and 2 (or 1) micro-steps: micro-steps 1 and 2 of each full window are
    # idle; the partial window has none.
    for label in ("deferred", "deferred-noclip"):
        fast, slow = results[(label, True)], results[(label, False)]
        assert fast["skipped"] == 4 and slow["skipped"] == 0, label
        # One reduction per module and window, every one served by the all-reduce.
        assert fast["pair_calls"] == 3 * 3 and slow["pair_calls"] == 0, label
        # One all-gather per module and window (FSDP2's forward order cleared before the last
        # micro-step: no prefetch of a module the last backward just resharded).
        assert fast["all_gathers"] == slow["all_gathers"] == 3 * 3, label
        # Every all-gather served by the 2-rank exchange.
        assert fast["pair_gathers"] == 3 * 3 and slow["pair_gathers"] == 0, label
    # Eager windows reduce in every micro-step: the hooks do the reduction, never skipped.
    assert results[("eager", True)]["skipped"] == 0
    assert results[("eager", True)]["pair_calls"] == 3 * 10
    # bf16 compute with an fp32 reduce_dtype: the hooks upcast the gradient, they stay.
    assert results[("mixed", True)]["skipped"] == 0
    # Handles not where torch 2.13 keeps them: the hooks stay (the correct, slower path).
    assert results[("no-handles", True)]["skipped"] == 0
    # Sharded window: no hooks skipped, the final reduce-scatters served by the all-reduce.
    assert results[("sharded", True)]["skipped"] == 0
    assert results[("sharded", True)]["pair_calls"] == 3 * 3


class _Inner:
    """A stand-in for FSDP2's reduce-scatter comm: records the calls it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: object,
                 op: object, async_op: bool = False) -> str:
        self.calls.append((output_tensor.numel(), input_tensor.numel(), op, async_op))
        return "inner"


class _Group:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return 0


def test_pair_comm_hands_everything_else_to_the_comm_that_was_there() -> None:
    """No process group needed: every case the exchange does not serve (an async call,
    another op, a group of 3, an input that is not twice the output, another dtype, an
    output inside the input's memory) reaches the inner comm untouched, and no send is
    issued (it would fail without a process group)."""
    import torch.distributed as dist

    from accumguard.engines.fsdp2 import _PairAllReduceScatter

    inner = _Inner()
    comm = _PairAllReduceScatter(inner)  # type: ignore[arg-type]
    out, inp = torch.zeros(4), torch.ones(8)
    cases = [(out, inp, _Group(2), dist.ReduceOp.SUM, True),
             (out, inp, _Group(2), dist.ReduceOp.AVG, False),
             (out, inp, _Group(3), dist.ReduceOp.SUM, False),
             (out, torch.ones(12), _Group(2), dist.ReduceOp.SUM, False),
             (out.double(), inp, _Group(2), dist.ReduceOp.SUM, False),  # another dtype
             (inp[4:], inp, _Group(2), dist.ReduceOp.SUM, False)]  # output inside the input
    for o, i, g, op, async_op in cases:
        assert comm(o, i, g, op, async_op) == "inner"  # type: ignore[arg-type]
    assert len(inner.calls) == 6 and comm.calls == 0


def test_forward_order_left_alone_where_torch_keeps_it_elsewhere() -> None:
    """A root state without FSDP2's private comm context: nothing cleared, nothing raised
    (FSDP2's own prefetch, one extra all-gather per window, stays)."""
    from accumguard.engines._fsdp2_window import IdleHooks

    hooks = IdleHooks.__new__(IdleHooks)
    hooks._root_state = object()
    hooks.forget_forward_order()
