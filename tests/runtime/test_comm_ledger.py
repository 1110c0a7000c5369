"""The collective ledger (``watch``'s ``comm`` record) on real DDP and FSDP2 runs, 2 gloo ranks,
against the closed form of each engine and mode; and its rule, EXTRA_SYNC at warning level.

One torchrun launch records every scenario: comm_sweep.py's DDP and FSDP2 loops, then the
DeepSpeed runs of ds_train.py (tests/watch_sweep.py's ``watch_many``: each case recorded in
its own directory as ``watch`` records it); the rule cases that need no engine run on
hand-made records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_watch import _torchrun  # the launcher helper of the watch tests
from watch_sweep import watch_many

from accumguard.observe._collectives import DDP_BUCKET_OP
from accumguard.observe._records import RunRecording
from accumguard.watch._findings import analyze, load_recordings

K, STEPS = 4, 3
MLP_BYTES = (8 * 16 + 16 + 16 * 4 + 4) * 4  # sweep_dist.mlp(), float32: every gradient once
WIDE_BYTES = (8 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4) * 4  # comm_sweep's small-bucket net


#: comm_sweep.py's scenarios (``comm_sweep.py run NAME``: one scenario, unrecorded)
COMM_CASES = ("ddp_ok", "ddp_backward_only", "ddp_every", "ddp_buckets", "fsdp2_ok",
              "fsdp2_every")
DS_CASES = [("native", 2, True), ("coalesce", 2, False), ("native", 1, False)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every scenario in ONE torchrun launch (``watch_many``): the DDP/FSDP2 loops of
    comm_sweep.py first, then the three DeepSpeed runs (without DeepSpeed installed, only
    the first). Each case's recording is ``OUT/<name>``."""
    import importlib.util

    out = tmp_path_factory.mktemp("comm")
    cases = {name: _torchrun("comm_sweep.py", "run", name) for name in COMM_CASES}
    if importlib.util.find_spec("deepspeed") is not None:
        cases.update({f"{mode}_z{stage}": _torchrun(
            "ds_train.py", "--mode", mode, "--stage", str(stage)) for mode, stage, _ in DS_CASES})
    ran = watch_many(out, cases, k=K, timeout=600)
    failed = {name: w.proc.stderr[-2000:] for name, w in ran.items() if w.proc.returncode}
    assert not failed, failed
    return out


@pytest.fixture(scope="module")
def sweep(runs: Path) -> Path:
    return runs


def _per_micro(step: dict[str, Any], ops: set[str]) -> dict[int, tuple[int, int]]:
    """micro-step -> (calls, bytes) of the given ops inside the backwards of one window."""
    out: dict[int, tuple[int, int]] = {}
    for op, micro, in_bw, calls, nbytes, _ in step["comm"]["rows"]:
        if op in ops and in_bw:
            c, b = out.get(micro, (0, 0))
            out[micro] = (c + calls, b + nbytes)
    return out


def _steps(sweep: Path, name: str) -> dict[int, list[dict[str, Any]]]:
    rec = load_recordings(sweep / name)
    assert sorted(rec.steps) == [0, 1] and all(len(s) == STEPS for s in rec.steps.values())
    return rec.steps


@pytest.mark.parametrize(("name", "synced"), [
    ("ddp_ok", [3]), ("ddp_backward_only", [0, 1, 2, 3]), ("ddp_every", [0, 1, 2, 3]),
    ("ddp_buckets", [3])])
def test_ddp_bucket_all_reduces_equal_the_closed_form(sweep: Path, name: str,
                                                      synced: list[int]) -> None:
    """DDP deferred: one all-reduce of every bucket at the last backward, the buckets
    together the whole gradient; undeferred (or no_sync around the backward only, which
    DDP ignores): the same on every micro-step."""
    total = WIDE_BYTES if name == "ddp_buckets" else MLP_BYTES
    for steps in _steps(sweep, name).values():
        for s in steps:
            got = _per_micro(s, {DDP_BUCKET_OP})
            assert sorted(got) == synced, s["comm"]
            assert all(b == total for _, b in got.values()), s["comm"]
    if name == "ddp_buckets":  # rebuilt after the first step into two buckets of <= 5 kB
        assert [_per_micro(s, {DDP_BUCKET_OP})[3][0] for s in _steps(sweep, name)[0]][1:] \
            == [2, 2]


@pytest.mark.parametrize(("name", "synced"), [("fsdp2_ok", [3]), ("fsdp2_every", [0, 1, 2, 3])])
def test_fsdp2_reduce_scatters_and_all_gathers_equal_the_closed_form(
        sweep: Path, name: str, synced: list[int]) -> None:
    """FSDP2 (2 groups, reshard_after_forward=True): one reduce-scatter per group at each
    synced backward, the groups together the whole gradient; every micro-step all-gathers
    each group twice (forward, and again in the backward after the reshard)."""
    for steps in _steps(sweep, name).values():
        for s in steps:
            rs = _per_micro(s, {"reduce_scatter_single", "reduce_scatter_tensor"})
            assert rs == {m: (2, MLP_BYTES) for m in synced}, s["comm"]
            ag: dict[int, tuple[int, int]] = {}
            for op, micro, _, calls, nbytes, _ in s["comm"]["rows"]:
                if op.startswith("all_gather"):
                    c, b = ag.get(micro, (0, 0))
                    ag[micro] = (c + calls, b + nbytes)
            assert ag == {m: (4, 2 * MLP_BYTES) for m in range(K)}, s["comm"]


@pytest.mark.parametrize(("name", "extra", "noop"), [
    ("ddp_ok", 0, False), ("ddp_buckets", 0, False), ("fsdp2_ok", 0, False),
    ("ddp_backward_only", 3, True), ("ddp_every", 3, False), ("fsdp2_every", 6, False)])
def test_extra_syncs_are_warnings_with_their_cost(sweep: Path, name: str, extra: int,
                                                  noop: bool) -> None:
    found, _, _ = analyze(load_recordings(sweep / name), k_flag=K)
    assert not [f for f in found if f.severity == "error"], found
    warns = [f for f in found if f.cls == "EXTRA_SYNC"]
    if not extra:  # a correct deferred loop: silent
        assert warns == [], warns
        return
    assert [(f.severity, f.rank) for f in warns] == [("warning", 0), ("warning", 1)]
    w = warns[0]
    extra_bytes = 3 * MLP_BYTES
    assert f"{extra} extra collective(s)" in w.title and f"{extra_bytes / 1e3:.3g} kB" in w.title
    assert "not an error" in w.evidence
    assert ("deferral that does nothing" in w.title) == noop
    if name.startswith("fsdp2"):  # Python-level calls: their measured share of the step
        assert "% of the step's" in w.evidence and "set_requires_gradient_sync" in w.fix
    else:
        assert "advise" in w.evidence and "no_sync" in w.fix


def _ledgered(rows: list[list[Any]], engine: str = "local") -> RunRecording:
    steps = [{"kind": "step", "rank": 0, "step": i, "backwards": K, "applied": True,
              "engine": engine, "forwards": [1] * K, "comm": {"rows": rows, "window_s": 1.0}}
             for i in range(2)]
    return RunRecording(steps={0: steps}, end={0: {"kind": "end"}})


def test_small_per_micro_step_reductions_are_not_gradient_syncs() -> None:
    """A token count all-reduced after every backward (8 bytes) beside one gradient
    all-reduce after the last: correct and silent. A gradient-sized one after each
    backward: the warning, with the time Python measured."""
    grad = ["all_reduce", K, False, 1, 4000, 0.01]
    counts = [["all_reduce", m, False, 1, 8, 0.001] for m in range(1, K)]
    found, _, _ = analyze(_ledgered([*counts, grad]), k_flag=K)
    assert [f for f in found if f.cls == "EXTRA_SYNC"] == []
    per_micro = [["all_reduce", m, False, 1, 4000, 0.1] for m in range(1, K)]
    found, _, _ = analyze(_ledgered([*per_micro, grad]), k_flag=K)
    (w,) = [f for f in found if f.cls == "EXTRA_SYNC"]
    assert w.severity == "warning" and "30 % of the step's 1 s" in w.evidence
    assert "once, after the window's last backward" in w.fix
    # a hand-written reduction: what each call reduced is not recorded, so the warning does
    # not claim the same gradient (blind round 43 b_b03: a SUM of the accumulated .grad in a
    # post-accumulate-grad hook, 55 % off, was told "the optimizer receives the same gradient")
    assert "receives the same gradient" not in w.evidence
    assert "not recorded" in w.evidence and "AG154" in w.evidence


def test_deepspeed_reducing_inside_every_backward_is_not_judged() -> None:
    rows = [["reduce_scatter_fn", m, True, 1, 4000, 0.01] for m in range(K)]
    found, _, _ = analyze(_ledgered(rows, engine="deepspeed"), k_flag=K)
    assert [f for f in found if f.cls == "EXTRA_SYNC"] == []


DS_BYTES = (8 * 32 + 32 + 32 + 1) * 4  # ds_train.py's model, float32


@pytest.fixture(scope="module")
def ds_runs(runs: Path) -> Path:
    """The three DeepSpeed runs, in the module's one torchrun launch (``runs``; they ran in
    a ``deepspeed`` launch of their own before: the ``deepspeed`` launcher under the real
    ``watch`` CLI is tests/runtime/test_watch.py::test_deepspeed_launcher_native)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:  # (not imported here: the ranks do)
        pytest.skip("deepspeed is not installed")
    return runs


@pytest.mark.parametrize(("mode", "stage", "per_micro"), DS_CASES)
def test_deepspeed_reductions_and_gathers(ds_runs: Path, mode: str, stage: int,
                                          per_micro: bool) -> None:
    """DeepSpeed 0.19.8 (2 CPU ranks, gloo), measured: ZeRO-2 with gradient_accumulation_steps
    = K reduces the whole gradient inside every backward (K reductions per step); inside
    coalesce_grad_reduction(), or on ZeRO-1, once; every step then all-gathers the updated
    parameter partitions once. Never an EXTRA_SYNC (DeepSpeed is not judged by the ledger)."""
    keep = ds_runs / f"{mode}_z{stage}"
    rec = load_recordings(keep)
    for s in rec.steps[0][1:]:  # after the first step (set-up collectives)
        rows = s["comm"]["rows"]
        grads = [(m, bw, c, b) for op, m, bw, c, b, _ in rows if op == "all_reduce" and b >= 64]
        gathers = [(c, b) for op, _, _, c, b, _ in rows if op.startswith("all_gather")]
        if per_micro:
            assert grads == [(m, True, 1, DS_BYTES) for m in range(K)], rows
        else:
            assert sum(c for *_, c, _ in grads) in (1, 2), rows  # one gradient round at the end
            assert sum(b for *_, b in grads) >= DS_BYTES and all(
                m >= K - 1 for m, *_ in grads), rows
        assert len(gathers) == 1 and gathers[0][0] == 1 and gathers[0][1] >= DS_BYTES, rows
    found, _, _ = analyze(rec, k_flag=K)
    assert not [f for f in found if f.cls == "EXTRA_SYNC" or f.severity == "error"], found


def test_other_collectives_of_a_ddp_run_are_not_its_gradient_sync() -> None:
    """DDP deferred correctly (buckets at the last backward only) with a tensor-parallel-like
    all-reduce of activation gradients inside every backward: not an extra sync. The same
    run with the buckets on every backward: the warning counts the buckets only."""
    tp = [["all_reduce", m, True, 2, 6000, 0.01] for m in range(K)]
    last = [[DDP_BUCKET_OP, K - 1, True, 1, 4000, None]]
    found, _, _ = analyze(_ledgered([*tp, *last], engine="ddp"), k_flag=K)
    assert [f for f in found if f.cls == "EXTRA_SYNC"] == []
    every = [[DDP_BUCKET_OP, m, True, 1, 4000, None] for m in range(K)]
    found, _, _ = analyze(_ledgered([*tp, *every], engine="ddp"), k_flag=K)
    (w,) = [f for f in found if f.cls == "EXTRA_SYNC"]
    assert "3 extra collective(s), 12 kB" in w.title, w.title


def test_a_static_graph_ddp_is_not_told_to_use_no_sync() -> None:
    """DDP built with static_graph=True does not support no_sync() (torch 2.13 stops with an
    internal assert in its reducer): the warning's fix must not break the script."""
    rows = [[DDP_BUCKET_OP, m, True, 1, 4000, None] for m in range(K)]
    run = _ledgered(rows, engine="ddp")
    found, _, _ = analyze(run, k_flag=K)
    (w,) = [f for f in found if f.cls == "EXTRA_SYNC"]
    assert "with model.no_sync()" in w.fix and "static_graph" not in w.fix
    for s in run.steps[0]:
        s["comm"]["ddp_static_graph"] = True
    found, _, _ = analyze(run, k_flag=K)
    (w,) = [f for f in found if f.cls == "EXTRA_SYNC"]
    assert "static_graph=True" in w.fix and "without static_graph" in w.fix
