"""Diagnosis: each failure hypothesis, simulated in fp64, against real broken loops.

Part 1 runs real loops on 2 gloo ranks, with the audit *in place* (each rank calls
``audit_many`` inside an initialised process group, the torchrun path), on a setup
with a final partial window and gradient clipping: F7 (÷K and dropped), F8, F13.
Part 2 checks, single-process, the cases that need no ranks: F9 (engine clipping at
1.0), F2 named from DeepSpeed context, and "unexplained" for an unknown bug.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard.core.window import StepRecord, sum_records
from accumguard.demo.toy import (
    TokenMLP,
    count_tokens,
    make_rank_batches,
    token_loss,
)
from accumguard.verify.audit import AuditReport, audit_many
from accumguard.verify.contract import AuditSetup, LoopContext
from accumguard.verify.diagnosis import diagnose
from accumguard.verify.reference import flat_params, reference_run, windows_for_reference
from accumguard.verify.report import AuditStep, LoopObservation

K = 4
CLIP = 0.2


def build_model() -> torch.nn.Module:
    torch.manual_seed(21)
    return TokenMLP()


def make_optimizer(params):  # noqa: ANN001, ANN201
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def even_batches(rank: int, world: int) -> list:
    # Equal token counts (no padding): a mean of means is exact, so only the partial
    # window (10 = 4 + 4 + 2 micro-batches) can go wrong.
    return make_rank_batches(seed=5, world_size=world, micro_batches=10, uneven=False)[rank]


SETUP_B = AuditSetup(build_model=build_model, make_optimizer=make_optimizer,
                     rank_batches=even_batches, loss_fn=token_loss, accumulation_steps=K,
                     max_grad_norm=CLIP, count_fn=count_tokens)


def ddp_loop_b(ctx: LoopContext, bug: str = "") -> None:
    model = DDP(ctx.model)
    opt = ctx.make_optimizer(model.parameters())
    k = ctx.accumulation_steps + (1 if bug == "counter_plus_one" else 0)
    for start in range(0, len(ctx.batches), k):
        window = ctx.batches[start:start + k]
        if bug == "drop_partial" and len(window) < k:
            break
        n = torch.tensor(float(sum(int(count_tokens(b)) for b in window)))
        dist.all_reduce(n)
        for j, batch in enumerate(window):
            last = j == len(window) - 1
            with contextlib.nullcontext() if last else model.no_sync():
                loss, cnt = ctx.loss_fn(model, batch)
                if bug in ("partial_div_k", "mean_of_means"):
                    (loss / cnt / ctx.accumulation_steps).backward()  # mean/K, also when short
                else:
                    (loss * ctx.world_size / n).backward()
            if bug == "clip_per_micro" and not last:
                torch.nn.utils.clip_grad_norm_(model.parameters(), ctx.max_grad_norm)
        if ctx.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), ctx.max_grad_norm)
        opt.step()
        opt.zero_grad()


BROKEN_B = {"partial_div_k": "F7", "drop_partial": "F7", "clip_per_micro": "F8",
            "counter_plus_one": "F13"}


def build_bf16() -> torch.nn.Module:
    return build_model().to(torch.bfloat16)


def uneven_b(rank: int, world: int) -> list:
    return make_rank_batches(seed=7, world_size=world, micro_batches=8)[rank]


# bf16 weights: the update is re-rounded to u·|θ| every step, the gradient check decides.
SETUP_BF16 = AuditSetup(build_model=build_bf16, make_optimizer=make_optimizer,
                        rank_batches=uneven_b, loss_fn=token_loss, accumulation_steps=K,
                        count_fn=count_tokens)


def _in_place(rank: int, world: int) -> tuple[dict[str, AuditReport], dict[str, AuditReport]]:
    loops = {"correct": ddp_loop_b}
    loops.update({name: functools.partial(ddp_loop_b, bug=name) for name in BROKEN_B})
    # Two setups, one spawn: the audit runs in place inside this process group.
    bf16 = audit_many(SETUP_BF16, {"bf16_correct": ddp_loop_b,
                                   "bf16_mean_of_means": functools.partial(
                                       ddp_loop_b, bug="mean_of_means")})
    return audit_many(SETUP_B, loops), bf16


@pytest.fixture(scope="module")
def both(torch_spawn: dict[str, list[Any]]) -> list:
    """The 2 ranks of ``_in_place``, run in the session's shared gloo spawn
    (``ds_spawn.TORCH_WORKERS``)."""
    return torch_spawn["test_diagnosis"]


@pytest.fixture(scope="module")
def reports_bf16(both) -> dict[str, AuditReport]:
    return both[0][1]


def test_bf16_correct_loop_passes_and_mean_of_means_is_caught(reports_bf16) -> None:
    ok, bad = reports_bf16["bf16_correct"], reports_bf16["bf16_mean_of_means"]
    # bf16 throughout: gradients summed in bf16 over K micro-steps and W ranks.
    assert ok.param_dtype == "bfloat16" and ok.tolerance == 2 * (K + 2) * 2.0 ** -8
    assert ok.passed, ok.failures
    assert ok.max_grad_error <= ok.tolerance
    assert not bad.passed and "gradient error" in bad.failures[0]
    assert bad.diagnosis.explained and bad.diagnosis.bug_id == "F5", bad.diagnosis.summary()


@pytest.fixture(scope="module")
def reports_b(both) -> dict[str, AuditReport]:
    per_rank = [r[0] for r in both]
    out = per_rank[0]
    for name, r in out.items():
        d = r.diagnosis
        print(f"\n  {name:18s} passed={r.passed} max_err={r.max_update_error:.2e} steps="
              f"{r.optimizer_steps}/{r.reference_steps} "
              + ("" if d is None else f"-> {d.summary()} | runner-up "
                 f"{d.runner_up.id if d.runner_up else None} "
                 f"{d.runner_up.residual if d.runner_up else float('nan'):.2g}"))
    # Both ranks computed the same verdicts in place.
    assert {k: v.passed for k, v in per_rank[1].items()} == {k: v.passed for k, v in out.items()}
    return out


def test_in_place_correct_loop_passes_with_partial_window_and_clipping(reports_b) -> None:
    r = reports_b["correct"]
    assert r.passed, r.failures
    assert r.optimizer_steps == r.reference_steps == 3
    assert [s.counts.backward for s in r.steps] == [4, 4, 2]


@pytest.mark.parametrize("name", list(BROKEN_B))
def test_broken_loop_diagnosed(reports_b, name: str) -> None:
    r = reports_b[name]
    assert not r.passed
    d = r.diagnosis
    assert d is not None and d.explained, d and d.summary()
    assert d.bug_id == BROKEN_B[name], d.summary()
    assert d.runner_up is None or d.runner_up.residual > 10 * max(d.residual, 1e-6)


def test_partial_window_bug_diverges_only_at_the_partial_window(reports_b) -> None:
    r = reports_b["partial_div_k"]
    assert r.first_divergence is not None and r.first_divergence.step == 2
    assert max(s.update_error for s in r.steps[:2]) <= 1e-5


# -- single process: hypotheses against independently computed trajectories -----------------

def big_loss(model, batch):  # noqa: ANN001, ANN201
    s, n = token_loss(model, batch)
    return 40 * s, n  # large gradients, so that a clip at norm 1.0 is active


def uneven_batches(rank: int, world: int) -> list:
    return make_rank_batches(seed=6, world_size=world, micro_batches=8)[rank]


def _fake(setup: AuditSetup, traj: list[dict], grads: list | None, *, engine: str = "ddp",
          engine_info: dict | None = None, n_ref: int = 2,
          zero_grads: list[int] | None = None):
    """An observation and report as the audit builds them, for a trajectory computed here."""
    init = flat_params(setup.build_model())
    records = [StepRecord(step=i, zero_grad_calls=(zero_grads or [1] * len(traj))[i])
               for i in range(len(traj))]
    obs = LoopObservation(
        name="fake", initial=init, params=list(traj), grads=grads or [None] * len(traj),
        lrs=[], records=records, trailing=StepRecord(step=len(traj), optimizer_steps=0), loss_sums=[], loss_counts=[],
        engine=engine, engine_info=engine_info or {}, outer_optimizers=[],
        param_dtypes=["float32"], snapshot_failed=None, notes=[])
    moved = any(any(not torch.equal(p[k], init[k]) for k in init) for p in traj)
    steps = [AuditStep(step=i, update_error=None, grad_error=None, lr=None, ref_lr=None,
                       loss=None, ref_loss=None, counts=c) for i, c in enumerate(records)]
    totals = sum_records(records)
    rep = AuditReport(
        name="fake", passed=False, tolerance=1e-5, tolerance_reason="", world_size=2,
        accumulation_steps=setup.accumulation_steps, epochs=setup.epochs, engine=engine,
        param_dtype="float32", compute_dtype="float32", reference_dtype="float64",
        optimizer_steps=len(traj), reference_steps=n_ref, steps=steps, totals=totals,
        first_divergence=None, failures=["fake"], notes=[], losses=[], loss_source="reference",
        gradients_observed=grads is not None, ranks_max_param_diff=0.0, trailing_backward=0,
        duration_s=0.0, parameters_moved=moved, engine_info=engine_info or {})
    return [obs, obs], rep


def test_engine_default_clipping_is_named_f9() -> None:
    setup = AuditSetup(build_model=build_model, make_optimizer=make_optimizer,
                       rank_batches=uneven_batches, loss_fn=big_loss, accumulation_steps=K)
    data = [uneven_batches(r, 2) for r in range(2)]
    # What DeepSpeed's default does: the correct gradient, clipped at 1.0.
    observed = reference_run(build_model(), make_optimizer, windows_for_reference(data, K),
                             big_loss, max_grad_norm=1.0)
    obs, rep = _fake(setup, observed.params, None)
    d = diagnose(setup, data, obs, rep)
    assert d.explained and d.bug_id == "F9", d.summary()


def test_last_micro_batch_only_under_deepspeed_is_named_f2() -> None:
    setup = AuditSetup(build_model=build_model, make_optimizer=make_optimizer,
                       rank_batches=uneven_batches, loss_fn=token_loss, accumulation_steps=K)
    data = [uneven_batches(r, 2) for r in range(2)]
    # Only each rank's last micro-batch of every window reaches the optimizer.
    last_only = [[rank[i + K - 1] for rank in data] for i in range(0, 8, K)]
    observed = reference_run(build_model(), make_optimizer, last_only, token_loss)
    obs, rep = _fake(setup, observed.params, observed.grads, engine="deepspeed",
                     engine_info={"zero_stage": 2, "gradient_accumulation_steps": 1})
    d = diagnose(setup, data, obs, rep)
    assert d.explained and d.bug_id == "F2", d.summary()
    obs, rep = _fake(setup, observed.params, observed.grads)  # no context: both named
    assert diagnose(setup, data, obs, rep).bug_id == "F2/F3"


def test_an_unknown_bug_is_unexplained() -> None:
    setup = AuditSetup(build_model=build_model, make_optimizer=make_optimizer,
                       rank_batches=uneven_batches, loss_fn=token_loss, accumulation_steps=K)
    data = [uneven_batches(r, 2) for r in range(2)]
    good = reference_run(build_model(), make_optimizer, windows_for_reference(data, K),
                         token_loss)
    g = torch.Generator().manual_seed(0)
    noisy = [{k: v + 1e-2 * torch.randn(v.shape, generator=g, dtype=v.dtype)
              for k, v in p.items()} for p in good.params]
    obs, rep = _fake(setup, noisy, None)
    d = diagnose(setup, data, obs, rep)
    assert not d.explained and d.bug_id == "unexplained"
    assert d.closest is not None and "unexplained" in d.summary()


def scaled_loss(model, batch, c: float):  # noqa: ANN001, ANN201
    s, n = token_loss(model, batch)
    return c * s, n


def one_window(rank: int, world: int) -> list:
    return make_rank_batches(seed=6, world_size=world, micro_batches=K)[rank]


def test_a_correct_loop_off_by_rounding_is_ok_not_f9() -> None:
    """Gradient norm 1 + 5e-6: clipping at 1.0 moves the prediction by 5e-6 < the 1e-5
    tolerance, so it cannot be told from the correct update. A correct loop whose update is
    1.5e-5 short (rounding) is nearer to that F9 prediction (1e-5) than to OK (1.5e-5), and
    must still read OK."""
    data = [one_window(r, 2) for r in range(2)]
    windows = windows_for_reference(data, K)
    g = reference_run(build_model(), make_optimizer, windows, token_loss).grads[0]
    norm = float(torch.sqrt(sum(t.pow(2).sum() for t in g.values())))
    loss = functools.partial(scaled_loss, c=(1 + 5e-6) / norm)
    setup = AuditSetup(build_model=build_model, make_optimizer=make_optimizer,
                       rank_batches=one_window, loss_fn=loss, accumulation_steps=K)
    good = reference_run(build_model(), make_optimizer, windows, loss)
    init = flat_params(build_model())
    short = [{k: init[k] + (1 - 1.5e-5) * (v - init[k]) for k, v in good.params[0].items()}]
    obs, rep = _fake(setup, short, None, n_ref=1)
    d = diagnose(setup, data, obs, rep)
    assert d.explained and d.bug_id == "OK", d.summary()
    assert all(c.id != "F9" for c in d.candidates), [c.id for c in d.candidates]


def test_a_shared_cache_reuses_the_simulations() -> None:
    """Several diagnoses of one setup and batches (one audit_many call) share the simulated
    trajectories: the second diagnosis of the same observation runs no backward at all."""
    from accumguard.verify.diagnosis import DiagnosisCache

    setup = AuditSetup(build_model=build_model, make_optimizer=make_optimizer,
                       rank_batches=uneven_batches, loss_fn=big_loss, accumulation_steps=K)
    data = [uneven_batches(r, 2) for r in range(2)]
    observed = reference_run(build_model(), make_optimizer, windows_for_reference(data, K),
                             big_loss, max_grad_norm=1.0)
    obs, rep = _fake(setup, observed.params, None)
    cache = DiagnosisCache()
    first = diagnose(setup, data, obs, rep, cache=cache)
    used = cache.grad_evaluations
    assert first.bug_id == "F9" and used > 0
    again = diagnose(setup, data, obs, rep, cache=cache)
    assert cache.grad_evaluations == used
    assert (again.bug_id, again.residual) == (first.bug_id, first.residual)
    # The cache is per setup and batches: other batches rebuild it.
    sim = cache._sim
    diagnose(setup, [list(rank) for rank in data], obs, rep, cache=cache)
    assert cache._sim is not sim
