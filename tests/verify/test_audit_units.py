"""Single-process checks of the audit's pieces: name matching of gradients, the observer's
patches, the error measure and tolerance, the step-pattern and no-update findings, and the
JSON schema of the report."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest
import torch
from schema_check import validate

import accumguard.verify
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss
from accumguard.verify._observer import Observer
from accumguard.verify.audit import _grad_error
from accumguard.verify.contract import AuditSetup, LoopContext
from accumguard.verify.diagnosis import diagnose
from accumguard.verify.reference import flat_params, reference_run, windows_for_reference
from accumguard.verify.tolerance import build_tolerance, update_errors, update_tolerance

K = 4
SCHEMA = json.loads((Path(accumguard.verify.__file__).parent / "audit.schema.json").read_text())


def build_model() -> torch.nn.Module:
    torch.manual_seed(21)
    return TokenMLP()


def make_optimizer(params):  # noqa: ANN001, ANN201
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def batches(rank: int, world: int) -> list:
    return make_rank_batches(seed=6, world_size=world, micro_batches=8)[rank]


SETUP = AuditSetup(build_model=build_model, make_optimizer=make_optimizer, rank_batches=batches,
                   loss_fn=token_loss, accumulation_steps=K, count_fn=count_tokens)


# -- gradients keyed under other names, or missing -------------------------------------------
def _grads() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(p.shape, generator=g, dtype=torch.float64)
            for n, p in build_model().named_parameters()}


def test_compiled_submodule_names_are_matched_not_skipped() -> None:
    ref = _grads()
    # What the loop's optimizer sees after `model.fc1 = torch.compile(model.fc1)`.
    obs = {n.replace("fc1.", "fc1._orig_mod."): t * 1.5 for n, t in ref.items()}
    err, missing = _grad_error(obs, ref)
    assert missing == [] and abs(err - 0.5) < 1e-12  # compared, and found wrong


def test_missing_gradients_fail_instead_of_matching() -> None:
    ref = _grads()
    partial = {k: v for k, v in ref.items() if not k.startswith("fc2")}
    err, missing = _grad_error(partial, ref)
    assert err == math.inf and sorted(missing) == ["fc2.bias", "fc2.weight"]
    err, missing = _grad_error({"something.else": torch.zeros(3)}, ref)
    assert err == math.inf and len(missing) == len(ref)


# -- the observer's patches keep the signatures others inspect -------------------------------
def test_zero_grad_patch_keeps_the_signature() -> None:
    """Accelerate passes set_to_none only if inspect.signature(optimizer.zero_grad) has it."""
    model = build_model()
    ctx = LoopContext(rank=0, world_size=1, setup=SETUP, model=model, batches=[])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = inspect.signature(opt.zero_grad)
    with Observer(ctx, "x", None).installed():
        assert "set_to_none" in inspect.signature(opt.zero_grad).parameters
        assert inspect.signature(opt.zero_grad) == before
        assert "set_to_none" in inspect.signature(model.zero_grad).parameters
        opt.zero_grad(set_to_none=True)
    assert torch.optim.Optimizer.zero_grad.__name__ == "zero_grad"


def test_a_step_without_gradients_is_not_a_step() -> None:
    model = build_model()
    ctx = LoopContext(rank=0, world_size=1, setup=SETUP, model=model, batches=[])
    obs = Observer(ctx, "x", None)
    with obs.installed():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.step()  # no gradient anywhere: a no-op
        s, n = token_loss(model, batches(0, 1)[0])
        (s / n).backward()
        opt.step()
        obs.finish()
    res = obs.result()
    assert len(res.params) == 1
    assert res.records[0].gradless_steps == 1 and res.records[0].optimizer_steps == 1


# -- error measure and tolerance ---------------------------------------------------------------
def test_update_error_is_finite_where_the_reference_does_not_move() -> None:
    init = {"w": torch.zeros(3, dtype=torch.float64)}
    ref = [{"w": torch.zeros(3, dtype=torch.float64)},  # LR 0 at step 0
           {"w": torch.full((3,), 2.0, dtype=torch.float64)}]
    moved = [{"w": torch.ones(3, dtype=torch.float64)}, ref[1]]
    errs = update_errors(init, moved, ref)
    assert errs[0] == pytest.approx(0.5) and errs[1] == 0.0
    # Neither moves: no error; only the target moves: ≥ 1, not ∞.
    assert update_errors(init, [init], [init]) == [0.0]
    assert update_errors(init, moved[:1], [init])[0] == pytest.approx(1.0)


def test_tolerance_follows_the_numerics() -> None:
    fp32 = build_tolerance(compute=torch.float32, accumulation=torch.float32,
                           params=torch.float32, accumulation_steps=4, world_size=2,
                           source="test")
    assert fp32.grad == 1e-5
    init = {"w": torch.ones(1000, dtype=torch.float64)}
    small = {"w": init["w"] + 1e-3}   # ‖θ‖/‖Δθ‖ = 1000: weight rounding dominates
    large = {"w": init["w"] + 1.0}
    t_small = update_tolerance(fp32, 2, init, small, 0.0)
    t_large = update_tolerance(fp32, 2, init, large, 0.0)
    assert t_large < 1.2e-5 < t_small < 1e-3
    bf16 = build_tolerance(compute=torch.bfloat16, accumulation=torch.float32,
                           params=torch.float32, accumulation_steps=512, world_size=2,
                           source="test", floor=[6e-3])
    # fp32 accumulation of K+W = 514 terms (beyond the 1e-5 floor), plus the measured
    # bf16 compute floor, doubled; no bf16 growth with K.
    assert bf16.grad == pytest.approx(2 * 514 * 2.0 ** -24) and bf16.floor == (1.2e-2,)
    pure = build_tolerance(compute=torch.bfloat16, accumulation=torch.bfloat16,
                           params=torch.bfloat16, accumulation_steps=4, world_size=2,
                           source="test")
    assert pure.grad == pytest.approx(2 * 6 * 2.0 ** -8)


# -- findings that are not fits ----------------------------------------------------------------
def _fake(traj, *, n_ref=2, zero_grads=None):  # noqa: ANN001, ANN202
    from test_diagnosis import _fake as fake

    return fake(SETUP, traj, None, n_ref=n_ref, zero_grads=zero_grads)


def _data() -> list[list]:
    return [batches(r, 2) for r in range(2)]


def test_step_pattern_names_f1_when_no_variant_fits() -> None:
    """8 steps for 8 micro-batches: no simulated F1 variant fits this (noisy) trajectory, but
    the count is the mechanism. Before: "unexplained, closest OK, residual None"."""
    data = _data()
    per_micro = [[rank[i] for rank in data] for i in range(8)]
    good = reference_run(build_model(), make_optimizer, per_micro, token_loss)
    g = torch.Generator().manual_seed(1)
    noisy = [{k: v + 3e-2 * torch.randn(v.shape, generator=g, dtype=v.dtype)
              for k, v in p.items()} for p in good.params]
    obs, rep = _fake(noisy)
    d = diagnose(SETUP, data, obs, rep)
    assert d.explained and d.bug_id == "F1" and d.basis == "step pattern", d.summary()
    assert d.residual is None and "step pattern" in d.evidence[0]
    # Same count, zero_grad only every K-th step: the partial-sum bug.
    obs, rep = _fake(noisy, zero_grads=[0, 0, 0, 1] * 2)
    assert diagnose(SETUP, data, obs, rep).bug_id == "F1b"


def test_an_unmatched_step_count_never_reads_closest_ok() -> None:
    data = _data()
    good = reference_run(build_model(), make_optimizer, windows_for_reference(data, K),
                         token_loss)
    traj = good.params * 3 + good.params[:1]  # 7 steps: no class predicts that
    obs, rep = _fake(traj)
    d = diagnose(SETUP, data, obs, rep)
    assert not d.explained and d.closest is None and d.residual is None
    assert "closest" not in d.summary() and "number of optimizer steps" in d.summary()
    assert "7 optimizer steps" in d.evidence[0]


def test_parameters_that_never_move_are_no_update() -> None:
    init = flat_params(build_model())
    obs, rep = _fake([init, init])
    d = diagnose(SETUP, _data(), obs, rep)
    assert d.bug_id == "NO_UPDATE" and d.basis == "no update" and d.closest is None


# -- the JSON report ---------------------------------------------------------------------------
def test_schema_accepts_a_report_and_rejects_a_broken_one() -> None:
    _, rep = _fake([flat_params(build_model())])
    rep.diagnosis = diagnose(SETUP, _data(), *_fake([flat_params(build_model())]))
    doc = {"schema_version": 2, "tool": "accumguard audit", "passed": False,
           "reports": {"fake": rep.to_dict()}}
    validate(json.loads(json.dumps(doc, allow_nan=False)), SCHEMA)
    bad = json.loads(json.dumps(doc))
    del bad["reports"]["fake"]["steps"]
    with pytest.raises(AssertionError, match="steps"):
        validate(bad, SCHEMA)
    bad = json.loads(json.dumps(doc))
    bad["reports"]["fake"]["loss_source"] = "elsewhere"
    with pytest.raises(AssertionError, match="loss_source"):
        validate(bad, SCHEMA)
