"""The guard on real DDP (2 gloo ranks): the Accumulator never trips it, correct hand
loops pass, and each known-broken loop raises the error of its failure class.

All scenarios run inside ONE spawn (module-scoped fixture) to keep the suite fast.
The guarded Accumulator run is also compared with the single-process reference,
so the guard is shown not to change a single number of the training.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard import Accumulator, run_on_ranks
from accumguard.demo.toy import count_tokens, token_loss
from accumguard.engines.ddp import DDPEngine
from accumguard.runtime.guard import guard
from accumguard.verify.reference import flat_params

from helpers import FP32_UPDATE_TOL, Case, make_data, make_model, make_optimizer, update_errors

K = 4
# 10 micro-batches per rank: windows of 4, 4 and a short final window of 2.
CASE = Case(accumulation_steps=K, micro_batches=10, optimizer="adamw", scheduler=True,
            max_grad_norm=0.5, seed=11)


def _sched(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))


def _accumulator(rank: int, world: int, sync: str, guard_sync: str) -> dict:
    ddp = DDP(make_model(CASE))
    engine = DDPEngine(ddp, sync=sync)
    opt = make_optimizer(CASE, ddp.parameters())
    sched = _sched(opt)
    scaler = torch.amp.GradScaler("cpu")
    acc = Accumulator(ddp, opt, accumulation_steps=K, engine=engine, scheduler=sched,
                      scaler=scaler, max_grad_norm=CASE.max_grad_norm, count_fn=count_tokens)
    data = make_data(CASE, world)[rank]
    snaps, colls = [], []
    with guard(ddp, opt, accumulation_steps=K, scheduler=sched, scaler=scaler, sync=guard_sync,
               total_micro_batches=len(data), check_sync_every=1) as g:
        for window in acc.windows(data):
            before = acc.grad_collectives
            window.run(lambda b: token_loss(ddp, b)[0])
            colls.append(acc.grad_collectives - before)
            snaps.append(flat_params(ddp))
    return {"snaps": snaps, "colls": colls, "windows": list(g.windows), "summary": g.summary()}


def _hand_loop(ddp: DDP, opt: Any, sched: Any, data: list, bug: str | None) -> None:
    """A plain DDP accumulation loop (loss = token sum / window tokens on this rank ×
    nothing fancy: the numbers do not matter here, only the order of operations)."""
    for i, batch in enumerate(data):
        last = (i + 1) % K == 0 or i + 1 == len(data)
        if bug == "sync_flag_after_forward":
            # build-nanogpt PR 30 shape: the flag is set between forward and backward.
            s, n = token_loss(ddp, batch)
            ddp.require_backward_grad_sync = last
            (s / 100).backward()
        elif bug == "no_sync_around_backward_only":
            s, n = token_loss(ddp, batch)
            with contextlib.nullcontext() if last else ddp.no_sync():
                (s / 100).backward()
        else:
            with contextlib.nullcontext() if last else ddp.no_sync():
                s, n = token_loss(ddp, batch)
                (s / 100).backward()
        if bug == "step_every_micro_step":
            opt.step()
            sched.step()
            opt.zero_grad()
            continue
        if bug == "zero_grad_inside_window":
            ddp.zero_grad()
        if bug == "scheduler_every_micro_step":
            sched.step()
        if last:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            opt.step()
            if bug != "scheduler_every_micro_step":
                sched.step()
            opt.zero_grad()


HAND_SCENARIOS = [
    (None, "raise"),
    ("step_every_micro_step", "raise"),
    ("zero_grad_inside_window", "raise"),
    ("scheduler_every_micro_step", "raise"),
    ("sync_flag_after_forward", "raise"),
    ("no_sync_around_backward_only", "raise"),
    ("sync_flag_after_forward", "warn"),
]


def _hand(rank: int, world: int, bug: str | None, mode: str) -> dict:
    import warnings

    ddp = DDP(make_model(CASE))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sched = _sched(opt)
    data = make_data(CASE, world)[rank]
    g = guard(ddp, opt, accumulation_steps=K, scheduler=sched, mode=mode,
              total_micro_batches=len(data), check_sync_every=1 if mode == "warn" else None)
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with g:
                _hand_loop(ddp, opt, sched, data, bug)
        except Exception as e:  # noqa: BLE001 - the error is the result
            error = (type(e).__name__, str(e))
    warned = [str(w.message) for w in caught if "accumguard" in type(w.message).__module__]
    return {"error": error, "warned": warned, "windows": list(g.windows),
            "violations": [v.error for v in g.violations], "notes": [n.kind for n in g.notes],
            "messages": [v.message for v in g.violations]}


def _one_rank_fails(rank: int, world: int) -> dict:
    """check_sync_every=1 and accumguard failing on rank 1 only (an injected internal error
    at its 3rd backward): rank 0 must not wait for ever in the check's all-gather; both ranks
    train on, exactly as without the guard."""
    import os
    import warnings

    from accumguard.observe._failsafe import ENV_FAULT

    def run(guarded: bool) -> tuple[list[torch.Tensor], Any, list[str]]:
        ddp = DDP(make_model(CASE))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        sched = _sched(opt)
        data = make_data(CASE, world)[rank]
        if not guarded:
            _hand_loop(ddp, opt, sched, data, None)
            return [p.detach().clone() for p in ddp.parameters()], None, []
        g = guard(ddp, opt, accumulation_steps=K, scheduler=sched,
                  total_micro_batches=len(data), check_sync_every=1)
        if rank == 1:  # read when the guard installs its observer
            os.environ[ENV_FAULT] = "Tensor.backward:post@3"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                g.install()
            finally:
                os.environ.pop(ENV_FAULT, None)
            with contextlib.closing(g):
                _hand_loop(ddp, opt, sched, data, None)
        return ([p.detach().clone() for p in ddp.parameters()], g.failure,
                [str(w.message) for w in caught])

    plain, _, _ = run(False)
    guarded, failure, warned = run(True)
    return {"same": all(torch.equal(a, b) for a, b in zip(plain, guarded, strict=True)),
            "failure": None if failure is None else failure.error, "warned": warned}


def _all(rank: int, world: int) -> dict:
    out: dict[str, Any] = {
        "acc_deferred": _accumulator(rank, world, "deferred", "deferred"),
        "acc_eager": _accumulator(rank, world, "eager", "eager"),
    }
    for bug, mode in HAND_SCENARIOS:
        out[f"{bug}-{mode}"] = _hand(rank, world, bug, mode)
    out["one_rank_fails"] = _one_rank_fails(rank, world)
    return out


def test_accumguard_failing_on_one_rank_neither_hangs_nor_changes_the_run(
        results: list[dict]) -> None:
    r0, r1 = results[0]["one_rank_fails"], results[1]["one_rank_fails"]
    assert r0["same"] and r1["same"]
    assert r0["failure"] is None and "InjectedFault" in (r1["failure"] or "")
    assert any("cross-rank gradient check is off" in w for w in r0["warned"]), r0["warned"]


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_on_ranks(_all, 2, timeout=240)


def test_accumulator_never_trips_the_guard_and_stays_exact(results: list[dict]) -> None:
    for key in ("acc_deferred", "acc_eager"):
        r = results[0][key]
        assert r["summary"]["violations"] == 0
        errors = update_errors(CASE, 2, r["snaps"])
        assert max(errors) <= FP32_UPDATE_TOL, (key, errors)


def test_one_reduce_and_one_step_per_window(results: list[dict]) -> None:
    """Seed test 1 on DDP: exactly one all-reduce round and one optimizer step per
    K micro-steps (and per short final window), counted by DDP's comm hook and by the guard."""
    for rank in (0, 1):
        r = results[rank]["acc_deferred"]
        assert r["colls"] == [1, 1, 1]
        assert [(w.backward_passes, w.sync_rounds, w.optimizer_steps, w.scheduler_steps)
                for w in r["windows"]] == [(4, 1, 1, 1), (4, 1, 1, 1), (2, 1, 1, 1)]
    eager = results[0]["acc_eager"]
    assert eager["colls"] == [4, 4, 2]
    assert [w.sync_rounds for w in eager["windows"]] == [4, 4, 2]


def test_no_step_on_a_micro_step(results: list[dict]) -> None:
    """Seed test 2 on DDP: correct loops never step before the window is complete, and a
    loop that does is stopped at its first micro-step."""
    for key in ("acc_deferred", "None-raise"):
        assert all(w.optimizer_steps == 1 for w in results[0][key]["windows"])
    name, message = results[0]["step_every_micro_step-raise"]["error"]
    assert name == "StepInsideWindowError"
    assert "[rank 0] [F1" in message and "window 0, micro-step 0" in message
    assert "after 1 of 4 backward passes" in message


def test_counter_resets_every_window(results: list[dict]) -> None:
    """Seed test 3 on DDP: the window counter restarts after each step (windows of 4, 4, 2
    with consecutive indices), for the Accumulator and for a correct hand loop."""
    for key in ("acc_deferred", "None-raise"):
        ws = results[1][key]["windows"]
        assert [w.index for w in ws] == [0, 1, 2]
        assert [w.backward_passes for w in ws] == [4, 4, 2]
    assert results[0]["None-raise"]["error"] is None


@pytest.mark.parametrize(("scenario", "error", "text"), [
    ("zero_grad_inside_window-raise", "ZeroGradInsideWindowError", "[F3"),
    ("scheduler_every_micro_step-raise", "SchedulerStepError", "[F4"),
    ("sync_flag_after_forward-raise", "GradientSyncError",
     "require_backward_grad_sync=True at forward but False at backward"),
])
def test_broken_loops_raise_their_failure_class(results: list[dict], scenario: str, error: str,
                                                text: str) -> None:
    for rank in (0, 1):
        name, message = results[rank][scenario]["error"]
        assert name == error, message
        assert text in message and f"[rank {rank}]" in message and "Fix:" in message


def test_no_sync_spanning_only_the_backward_is_a_note_not_an_error(results: list[dict]) -> None:
    """DDP decided at the forward to all-reduce, so every micro-step reduces: correct, only
    wasteful (issue 10: it used to get the F11 error text of the real bug)."""
    for rank in (0, 1):
        r = results[rank]["no_sync_around_backward_only-raise"]
        assert r["error"] is None and r["violations"] == []
        assert "note_no_sync_backward_only" in r["notes"]
        assert [w.sync_rounds for w in r["windows"]] == [4, 4, 2]
        assert sum("no_sync() entered after the forward" in w for w in r["warned"]) == 1


def test_sync_flag_after_forward_is_named_at_the_last_micro_step_too(results: list[dict]) -> None:
    """In warn mode the loop goes on: the window's last micro-step ran without sync."""
    r = results[0]["sync_flag_after_forward-warn"]
    assert any("window 0, micro-step 0: saw require_backward_grad_sync=True at forward but "
               "False at backward" in m for m in r["messages"])
    assert any("window 0, micro-step 3: saw no gradient all-reduce on the window's last "
               "micro-step (require_backward_grad_sync=False at its forward but True at "
               "backward" in m for m in r["messages"])


def test_warn_mode_warns_once_per_rule_and_sees_the_desync(results: list[dict]) -> None:
    r = results[0]["sync_flag_after_forward-warn"]
    assert r["error"] is None
    # the flag flips on every micro-step, but each rule warns once
    assert r["violations"].count("GradientSyncError") > 1
    assert sum("[F11 gradient synchronisation" in w for w in r["warned"]) == 1
    # the checksum all-gather sees that ranks stepped on different gradients
    assert "GradientDesyncError" in r["violations"]
    assert sum("post-sync gradients differ across ranks" in w for w in r["warned"]) == 1
