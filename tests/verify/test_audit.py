"""The audit on real loops (2 gloo ranks): correct loops pass, broken loops fail and are
diagnosed as their class.

All loops run in ONE spawn (``audit_many``). The setup: TokenMLP, uneven token counts,
SGD with momentum, a LambdaLR schedule, K=4, 8 micro-batches per rank (2 windows).
Every loop is a plain hand-written DDP loop (what users run), except the Accumulator
loop and the manual all-reduce loop.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard.core.errors import RankTimeoutError
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss
from accumguard.verify.audit import AuditReport, audit, audit_many
from accumguard.verify.contract import AuditSetup, LoopContext

from helpers import FP32_UPDATE_TOL

K = 4


def build_model() -> torch.nn.Module:
    torch.manual_seed(11)
    return TokenMLP()


def make_optimizer(params):  # noqa: ANN001, ANN201
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def make_scheduler(opt):  # noqa: ANN001, ANN201
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))


def rank_batches(rank: int, world: int) -> list:
    return make_rank_batches(seed=3, world_size=world, micro_batches=8)[rank]


SETUP = AuditSetup(build_model=build_model, make_optimizer=make_optimizer,
                   rank_batches=rank_batches, loss_fn=token_loss, accumulation_steps=K,
                   make_scheduler=make_scheduler, count_fn=count_tokens)


def _global_count(window: list) -> torch.Tensor:
    n = torch.tensor(float(sum(int(count_tokens(b)) for b in window)))
    dist.all_reduce(n)
    return n


def ddp_loop(ctx: LoopContext, bug: str = "") -> None:
    """A hand-written DDP loop with no_sync; ``bug`` switches on one known mistake."""
    model = DDP(ctx.model)
    opt = ctx.make_optimizer(model.parameters())
    sched = ctx.make_scheduler(opt)
    k = ctx.accumulation_steps
    for start in range(0, len(ctx.batches), k):
        window = ctx.batches[start:start + k]
        n_global = _global_count(window)
        n_local = float(sum(int(count_tokens(b)) for b in window))
        for j, batch in enumerate(window):
            last = j == len(window) - 1
            if bug == "zero_grad_inside":
                opt.zero_grad()
            if bug == "grad_none_inside":
                for p in model.parameters():
                    p.grad = None
            if bug == "sync_after_forward":
                loss, _ = ctx.loss_fn(model, batch)
                model.require_backward_grad_sync = last  # too late: DDP decided at forward
                (loss * ctx.world_size / n_global).backward()
                continue
            sync = last or bug == "step_every"
            with contextlib.nullcontext() if sync else model.no_sync():
                loss, n = ctx.loss_fn(model, batch)
                if bug == "step_every":
                    (loss / n).backward()
                elif bug == "mean_of_means":
                    (loss / n / k).backward()
                elif bug == "rank_mean":
                    (loss / n_local).backward()
                else:
                    (loss * ctx.world_size / n_global).backward()
            if bug == "step_every":
                opt.step()
                sched.step()
                opt.zero_grad()
            if bug == "sched_every" and not last:
                sched.step()
        if bug != "step_every":
            opt.step()
            sched.step()
            opt.zero_grad()


def manual_allreduce_loop(ctx: LoopContext) -> None:
    """No DDP: all-reduce SUM of DDP-style scaled gradients, forgetting to divide by W."""
    model = ctx.model
    opt = ctx.make_optimizer(model.parameters())
    sched = ctx.make_scheduler(opt)
    k = ctx.accumulation_steps
    for start in range(0, len(ctx.batches), k):
        window = ctx.batches[start:start + k]
        n_global = _global_count(window)
        for batch in window:
            loss, _ = ctx.loss_fn(model, batch)
            (loss * ctx.world_size / n_global).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        sched.step()
        opt.zero_grad()


def accumulator_loop(ctx: LoopContext) -> None:
    from accumguard import Accumulator

    model = DDP(ctx.model)
    opt = ctx.make_optimizer(model.parameters())
    acc = Accumulator(model, opt, accumulation_steps=ctx.accumulation_steps,
                      scheduler=ctx.make_scheduler(opt), count_fn=count_tokens)
    for window in acc.windows(ctx.batches):
        window.run(lambda b: ctx.loss_fn(model, b)[0])


BROKEN = {  # loop name -> the class the diagnosis must name
    "step_every": "F1",
    "zero_grad_inside": "F3",
    "grad_none_inside": "F2/F3",
    "sched_every": "F4",
    "mean_of_means": "F5",
    "rank_mean": "F6",
    "manual_allreduce": "F10",
    "sync_after_forward": "F11",
}


def _loops() -> dict:
    loops = {"ddp_correct": ddp_loop, "accumulator": accumulator_loop,
             "manual_allreduce": manual_allreduce_loop}
    for name in BROKEN:
        if name not in loops:
            loops[name] = functools.partial(ddp_loop, bug=name)
    return loops


@pytest.fixture(scope="module")
def reports() -> dict[str, AuditReport]:
    t0 = time.monotonic()
    seen: list[tuple[str, int, int]] = []
    out = audit_many(SETUP, _loops(), world_size=2, timeout=300,
                     progress=lambda name, done, total: seen.append((name, done, total)))
    # Progress arrives from rank 0 while the loops run: every loop's steps, out of 2.
    assert ("ddp_correct", 2, 2) in seen and ("step_every", 8, 2) in seen, seen
    print(f"\naudit_many of {len(out)} loops: {time.monotonic() - t0:.1f} s")
    for name, r in out.items():
        d = r.diagnosis
        print(f"  {name:20s} passed={r.passed} max_err={r.max_update_error:.2e} "
              + ("" if d is None else f"-> {d.summary()} | runner-up "
                 f"{d.runner_up.id if d.runner_up else None} "
                 f"{d.runner_up.residual if d.runner_up else float('nan'):.2g}"))
    return out


@pytest.mark.parametrize("name", ["ddp_correct", "accumulator"])
def test_correct_loops_pass(reports: dict[str, AuditReport], name: str) -> None:
    r = reports[name]
    assert r.passed, r.failures
    assert r.max_update_error <= FP32_UPDATE_TOL
    assert r.max_grad_error is not None and r.max_grad_error <= FP32_UPDATE_TOL
    assert r.optimizer_steps == r.reference_steps == 2
    assert r.engine == "ddp"
    assert r.diagnosis is None and r.first_divergence is None
    for s in r.steps:
        c = s.counts
        assert (c.backward, c.optimizer_steps, c.scheduler_steps, c.zero_grad_in_window) == (
            K, 1, 1, 0), c
        # Deferred sync: exactly one gradient all-reduce round per optimizer step.
        assert c.grad_collective_rounds == 1, c
        assert s.lr == s.ref_lr
    # The loop's own loss (through ctx.loss_fn) equals the reference's window loss.
    assert r.loss_source == "loop"
    for s in r.steps:
        assert abs(s.loss - s.ref_loss) <= 1e-5 * abs(s.ref_loss)


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_loop_is_caught_and_diagnosed(reports: dict[str, AuditReport], name: str) -> None:
    r = reports[name]
    assert not r.passed
    assert r.first_divergence is not None and r.first_divergence.step == 0
    assert r.first_divergence.update_error > 1e-2
    d = r.diagnosis
    assert d is not None and d.explained, d and d.summary()
    assert d.bug_id == BROKEN[name], d.summary()
    assert d.residual < d.threshold
    # The runner-up is clearly worse: the classes are told apart, not guessed.
    assert d.runner_up is not None and d.runner_up.residual > 10 * max(d.residual, 1e-6)
    assert d.fix


def test_counts_show_the_mechanism(reports: dict[str, AuditReport]) -> None:
    f1 = reports["step_every"]
    assert f1.optimizer_steps == 8 and f1.reference_steps == 2
    assert any("8 optimizer steps" in f for f in f1.failures)
    assert [s.counts.backward for s in f1.steps] == [1] * 8
    assert all(s.counts.zero_grad_in_window == K - 1 for s in reports["zero_grad_inside"].steps)
    assert [s.counts.scheduler_steps for s in reports["sched_every"].steps] == [K, K]
    assert reports["sync_after_forward"].ranks_max_param_diff > 1e-4
    manual = reports["manual_allreduce"]
    assert manual.engine == "custom"
    # Five parameters all-reduced one by one: 5 calls, one round per optimizer step.
    assert [(s.counts.grad_collective_calls, s.counts.grad_collective_rounds)
            for s in manual.steps] == [(5, 1), (5, 1)]
    assert reports["rank_mean"].diagnosis.runner_up is not None


def test_report_is_json_safe(reports: dict[str, AuditReport]) -> None:
    for r in reports.values():
        doc = json.loads(json.dumps(r.to_dict(), allow_nan=False))
        assert doc["passed"] == r.passed
        assert len(doc["steps"]) == r.optimizer_steps
        assert len(doc["losses"]) == r.optimizer_steps
    doc = reports["mean_of_means"].to_dict()
    assert doc["diagnosis"]["bug_id"] == "F5"
    assert {"step", "parameter", "max_abs_diff", "max_rel_diff"} <= set(doc["first_divergence"])


# -- never hang ------------------------------------------------------------------------------

def hanging_loop(ctx: LoopContext) -> None:
    if ctx.rank == 1:
        time.sleep(3600)


def _our_spawned_children() -> list[int]:
    """Live spawn-method children of this process (the ranks run_on_ranks started)."""
    me, out = os.getpid(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        if ppid == me and b"spawn_main" in cmd:
            out.append(int(pid))
    return out


def test_a_hanging_loop_times_out_and_leaves_no_process() -> None:
    """Rank 1 never returns: a clear RankTimeoutError naming it, within the timeout (+ the
    kill), and no rank process left behind. (A rank that *raises* is in test_cli_audit.py.)"""
    t0 = time.monotonic()
    with pytest.raises(RankTimeoutError) as info:
        audit(SETUP, hanging_loop, timeout=12)
    assert 1 in info.value.ranks
    assert time.monotonic() - t0 < 12 + 15
    assert _our_spawned_children() == []


def test_a_bad_setup_is_a_config_error() -> None:
    from accumguard.core.errors import ConfigError

    with pytest.raises(ConfigError, match="AuditSetup"):
        audit_many(object(), {"x": ddp_loop})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="steps"):
        audit(SETUP, ddp_loop, steps=0)



# -- DeepSpeed: gradient collectives are counted at the deepspeed.comm level -----------------
DS_LOOPS = ("deepspeed-z2/correct", "deepspeed-z2/bug-F2", "deepspeed-z3/accumulator",
            "deepspeed-z3/correct")


def ds_double_gated_loop(ctx: LoopContext) -> None:
    """F14: DeepSpeed config GA = K *and* a manual K-loop with one engine.step() per window:
    the engine counts one micro-step per step() call, so the optimizer steps every K-th
    window, on the last micro-batch, scaled by the engine's 1/K."""
    from accumguard.demo.loops import wrap_engine

    w = wrap_engine(ctx, "deepspeed-z2", ds_ga=ctx.accumulation_steps)
    engine = w.model
    for window in [ctx.batches[s:s + ctx.accumulation_steps]
                   for s in range(0, len(ctx.batches), ctx.accumulation_steps)]:
        n = _global_count(window)
        for batch in window:
            loss, _ = ctx.loss_fn(engine, batch)
            engine.backward(loss * ctx.world_size / n)
        before = engine.global_steps
        engine.step()
        if w.scheduler is not None and engine.global_steps > before:
            w.scheduler.step()  # once per real optimizer step, as DeepSpeed's own would


def _ds_in_place(rank: int, world: int) -> tuple[dict, dict]:
    """Both DeepSpeed setups in ONE spawn (DeepSpeed starts once): the demo's loops, and
    the double-gating loop at K=2 over 4 windows (so that its optimizer steps twice)."""
    from accumguard.demo.demo import demo_setup
    from accumguard.demo.loops import catalog

    items = {it.key: it for it in catalog(("deepspeed-z2", "deepspeed-z3"))}
    main = audit_many(demo_setup(model="mlp", steps=2),
                      {k: items[k].loop for k in DS_LOOPS}, timeout=600)
    f14 = audit_many(demo_setup(model="mlp", steps=4, accumulation_steps=2),
                     {"double_gated": ds_double_gated_loop,
                      "correct": items["deepspeed-z2/correct"].loop}, timeout=600)
    return main, f14


@pytest.fixture(scope="module")
def ds_both(deepspeed_spawn: dict[str, list[Any]]) -> tuple[dict, dict]:
    """Rank 0 of ``_ds_in_place``, run in the session's shared DeepSpeed spawn
    (``ds_spawn.WORKERS``: DeepSpeed imported and started once for all its modules)."""
    out: tuple[dict, dict] = deepspeed_spawn["test_audit"][0]
    return out


@pytest.fixture(scope="module")
def ds_reports(ds_both) -> dict[str, AuditReport]:
    return ds_both[0]


def test_deepspeed_double_gating_is_f14(ds_both) -> None:
    bad, ok = ds_both[1]["double_gated"], ds_both[1]["correct"]
    assert ok.passed, ok.failures
    assert ok.optimizer_steps == ok.reference_steps == 4
    assert not bad.passed and bad.optimizer_steps == 2  # every K-th of 4 windows
    d = bad.diagnosis
    assert d is not None and d.explained and d.bug_id == "F14", d and d.summary()
    assert d.residual is not None and d.residual <= d.threshold
    assert d.scale_label.startswith("1/K"), d.summary()
    assert any("gradient_accumulation_steps=2" in e for e in d.evidence)


def test_deepspeed_gradient_reductions_per_step(ds_reports: dict[str, AuditReport]) -> None:
    """ZeRO-3 reduce-scatters bypass torch.distributed; its step-time norm all-reduce is no
    gradient reduction. Accumulator (coalesced): 1 round per step; the engine's native GA=K
    (eager) and the GA=1 manual loop (F2): K rounds per step, one per backward."""
    expected = {"deepspeed-z2/correct": K, "deepspeed-z2/bug-F2": K,
                "deepspeed-z3/accumulator": 1, "deepspeed-z3/correct": K}
    for key, rounds in expected.items():
        rep = ds_reports[key]
        assert rep.engine == "deepspeed" and rep.optimizer_steps == 2, key
        assert [s.counts.grad_collective_rounds for s in rep.steps] == [rounds] * 2, key
        # Counted once, not again where deepspeed.comm calls torch.distributed.
        assert [s.counts.grad_collective_calls for s in rep.steps] == [rounds] * 2, key
        assert all(s.counts.step_reduce_calls >= 1 for s in rep.steps), key
    for key in ("deepspeed-z2/correct", "deepspeed-z3/accumulator", "deepspeed-z3/correct"):
        assert ds_reports[key].passed, (key, ds_reports[key].failures)
    bug = ds_reports["deepspeed-z2/bug-F2"]
    assert not bug.passed and bug.diagnosis is not None and bug.diagnosis.bug_id == "F2"
