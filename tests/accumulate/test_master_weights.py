"""fp32 master weights for bf16/fp16 parameters (``master_weights=True``, issue 13 item 2).

Equivalence grid in the style of test_equivalence_local_ddp.py: a bf16 TokenMLP trained by
the Accumulator (local, and DDP on 2 gloo ranks), the relative *update* error after every
optimizer step measured on the fp32 masters (the run's real weights), against

* the fp64 reference of the full effective batch (same bf16-rounded start). What remains
  there is the bf16 forward/backward of each micro-step, which no optimizer-side scheme can
  remove: measured 3-4e-3 with SGD here. Bound: ``BF16_COMPUTE_TOL`` = 1e-2, on SGD cases;
  Adam normalises every element's update, so near-zero gradients turn bf16 compute noise
  into 2-7e-2 of the update and an fp64 bound would only measure that noise;
* the same large batch at the same compute precision: fp32 weights, the forward under
  ``torch.autocast(bfloat16)`` (``reference_run(dtype=float32, autocast=bfloat16)``), i.e.
  what ideal mixed-precision training of the full batch does. Measured ≤ 1.8e-4 with SGD
  (the rest: per-micro-step rounding of the loss scale and the embedding's bf16 backward),
  ≤ 6.4e-4 with AdamW; bounds ``MIXED_TOL``: 5e-4 (SGD), 2e-3 (AdamW). The SGD bound fails
  a run whose masters get the fp32 sum rounded to bf16 (measured 1.9e-3 to 2.6e-3).

Negative checks: the same run without master weights (bf16 parameters updated in bf16,
whether the window was summed in fp32 or not) is ≥ 1e-2 off on both comparisons.
"""

from __future__ import annotations

import copy
import os
import tempfile
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard import Accumulator, ConfigError
from accumguard.demo.toy import count_tokens, token_loss
from accumguard.engines.precision import enable_master_weights
from accumguard.verify.reference import (
    flat_params,
    reference_run,
    relative_update_error,
    windows_for_reference,
)

from helpers import Case, make_data, make_model, make_optimizer, make_scheduler

BF16_COMPUTE_TOL = 1e-2  # fp64 reference, SGD cases (measured ≤ 4e-3; see the docstring)
# fp32 + bf16-autocast reference (measured ≤ 1.8e-4 SGD, ≤ 6.4e-4 AdamW: see the docstring)
MIXED_TOL = {"sgd": 5e-4, "adamw": 2e-3}
NO_MASTERS_MIN = 1e-2  # bf16 parameters stepped in bf16: measured ≥ 4e-2

GRID = [
    # partial final window (22 = 5 x 4 + 2), uneven tokens, SGD with momentum
    Case(accumulation_steps=4, micro_batches=22, optimizer="sgd"),
    # K = 1: every micro-step is a boundary
    Case(accumulation_steps=1, micro_batches=5, optimizer="sgd", seed=1),
    # clipping (active: the fp32 gradient's norm is well above 0.3) and a scheduler
    Case(accumulation_steps=4, micro_batches=22, optimizer="sgd", max_grad_norm=0.3,
         scheduler=True, seed=2),
    # AdamW (its state lives in fp32 on the masters), clipping, scheduler, GradScaler
    Case(accumulation_steps=4, micro_batches=20, optimizer="adamw", max_grad_norm=1.0,
         scheduler=True, scaler=True, seed=3),
]
# Cases without masters for the negative check (one per optimizer).
NEGATIVE = [GRID[0], GRID[3]]


def _bf16_model(case: Case) -> torch.nn.Module:
    return make_model(case).to(torch.bfloat16)


def _train(case: Case, model: torch.nn.Module, data: list, *, masters: bool = True,
           accumulation_dtype: str = "auto") -> tuple[list[dict[str, torch.Tensor]], Accumulator]:
    """Snapshots after every step: the masters where there are, else the parameters."""
    opt = make_optimizer(case, model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if case.scaler else None
    acc = Accumulator(model, opt, accumulation_steps=case.accumulation_steps,
                      scheduler=make_scheduler(case, opt), scaler=scaler,
                      max_grad_norm=case.max_grad_norm, count_fn=count_tokens,
                      accumulation_dtype=accumulation_dtype,  # type: ignore[arg-type]
                      master_weights=masters)
    snaps = []
    for window in acc.windows(data):
        window.run(lambda b: token_loss(model, b)[0])
        snaps.append(_weights(acc))
    return snaps, acc


def _weights(acc: Accumulator) -> dict[str, torch.Tensor]:
    out = flat_params(acc.model)
    if acc.masters is not None:
        out.update({n: m.to(torch.float64, copy=True)
                    for n, m in acc.masters.state_dict().items()})
    return out


def _errors(case: Case, world: int, snaps: list[dict[str, torch.Tensor]]
            ) -> tuple[list[float], list[float]]:
    """Per-step relative update errors vs (fp64 reference, fp32 + bf16-autocast reference)."""
    windows = windows_for_reference(make_data(case, world), case.accumulation_steps)
    out = []
    for dtype, autocast in ((torch.float64, None), (torch.float32, torch.bfloat16)):
        ref = reference_run(
            _bf16_model(case), lambda p: make_optimizer(case, p), windows, token_loss,
            make_scheduler=(lambda o: make_scheduler(case, o)) if case.scheduler else None,
            max_grad_norm=case.max_grad_norm, dtype=dtype, autocast=autocast)
        assert len(snaps) == len(ref.params), (case, len(snaps), len(ref.params))
        out.append([relative_update_error(ref.initial, s, r)
                    for s, r in zip(snaps, ref.params, strict=True)])
    return out[0], out[1]


def _check_grid(results: list[tuple[Case, list[dict[str, torch.Tensor]]]], world: int,
                where: str) -> None:
    for case, snaps in results:
        fp64, mixed = _errors(case, world, snaps)
        print(f"{where} {case.optimizer} K={case.accumulation_steps} masters: vs fp64 "
              f"max {max(fp64):.1e}, vs fp32+bf16 autocast max {max(mixed):.1e}")
        assert max(mixed) <= MIXED_TOL[case.optimizer], (case, mixed)
        if case.optimizer == "sgd":
            assert max(fp64) <= BF16_COMPUTE_TOL, (case, fp64)


def _check_negative(results: list[tuple[Case, list[dict[str, torch.Tensor]]]], world: int,
                    where: str) -> None:
    for case, snaps in results:
        fp64, mixed = _errors(case, world, snaps)
        print(f"{where} {case.optimizer} no masters: vs fp64 min {min(fp64):.1e}, "
              f"vs fp32+bf16 autocast min {min(mixed):.1e}")
        assert min(fp64) >= NO_MASTERS_MIN and min(mixed) >= NO_MASTERS_MIN, (case, fp64, mixed)


# -- local -----------------------------------------------------------------------------------

def test_local_masters_match_the_large_batch() -> None:
    results = []
    for case in GRID:
        snaps, acc = _train(case, _bf16_model(case), make_data(case, 1)[0])
        assert acc.masters is not None and acc.accumulation_dtype == "float32"
        # The model's bf16 parameters are the masters, rounded.
        for p, m in zip(acc.masters.params, acc.masters.masters, strict=True):
            assert torch.equal(p, m.to(torch.bfloat16)) and acc.masters.parameter_of(m) is p
        if case.max_grad_norm is not None:  # clipping saw the fp32 gradient
            assert all(r.grad_norm is not None and r.grad_norm.dtype == torch.float32
                       for r in acc.history)
        results.append((case, snaps))
        acc.close()
    _check_grid(results, 1, "local")


def test_local_without_masters_is_off_by_bf16_rounding() -> None:
    results = []
    for case in NEGATIVE:
        for mode in ("native", "auto"):
            snaps, _ = _train(case, _bf16_model(case), make_data(case, 1)[0], masters=False,
                              accumulation_dtype=mode)
            results.append((case, snaps))
    _check_negative(results, 1, "local")


# -- DDP on 2 gloo ranks (one spawn: grid, negative runs, checkpoint/resume) -----------------

def _ddp_worker(rank: int, world: int, root: str) -> dict[str, Any]:
    grid = []
    for case in GRID:
        snaps, acc = _train(case, DDP(_bf16_model(case)), make_data(case, world)[rank])
        colls = acc.grad_collectives
        grid.append((snaps, colls, acc.windows_seen))
        acc.close()
    negative = [_train(case, DDP(_bf16_model(case)), make_data(case, world)[rank],
                       masters=False)[0] for case in NEGATIVE]
    return {"grid": grid, "negative": negative, "resume": _dcp_resume(rank, world, root)}


def _dcp_resume(rank: int, world: int, root: str) -> bool:
    """save_checkpoint/load_checkpoint (torch DCP) mid-run into a freshly built DDP setup:
    the resumed run's masters and parameters are bitwise the uninterrupted run's."""
    from accumguard.accumulate.checkpoint import load_checkpoint, save_checkpoint

    case = GRID[3]  # AdamW (fp32 state), scheduler, clipping, GradScaler
    data = make_data(case, world)[rank]

    def build() -> tuple[torch.nn.Module, Accumulator]:
        model = DDP(_bf16_model(case))
        opt = make_optimizer(case, model.parameters())
        acc = Accumulator(model, opt, accumulation_steps=case.accumulation_steps,
                          scheduler=make_scheduler(case, opt),
                          max_grad_norm=case.max_grad_norm, count_fn=count_tokens,
                          master_weights=True)
        return model, acc

    def run(model: torch.nn.Module, acc: Accumulator, batches: list, stop: int | None = None
            ) -> None:
        for w in acc.windows(batches):
            w.run(lambda b: token_loss(model, b)[0])
            if stop is not None and acc.windows_seen == stop:
                return

    model, acc = build()
    run(model, acc, data)
    whole = _weights(acc)
    model, acc = build()
    run(model, acc, data, stop=2)
    save_checkpoint(f"{root}/ckpt", acc)
    model, acc = build()
    state = load_checkpoint(f"{root}/ckpt", acc)
    exp_avg = next(iter(acc.optimizer.state.values()))["exp_avg"]  # type: ignore[union-attr]
    assert exp_avg.dtype == torch.float32, exp_avg.dtype
    run(model, acc, data[state["micro_batches_consumed"]:])
    resumed = _weights(acc)
    return all(torch.equal(whole[k], resumed[k]) for k in whole)


def _ddp_worker_shared(rank: int, world: int) -> dict[str, Any]:
    """:func:`_ddp_worker` in the torch-only spawn shared with the other DDP modules of
    tests/accumulate (tests/ds_spawn.py): rank 0 makes the checkpoint folder, both use it
    (under the session's temporary folder, which conftest removes at the end)."""
    import torch.distributed as dist

    box: list[str | None] = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return _ddp_worker(rank, world, box[0])


@pytest.fixture(scope="module")
def ddp_results(torch_spawn: dict[str, list[Any]]) -> dict[str, Any]:
    out: dict[str, Any] = torch_spawn["test_master_weights"][0]
    return out


def test_ddp_masters_match_the_large_batch(ddp_results: dict[str, Any]) -> None:
    _check_grid([(case, snaps) for case, (snaps, _, _) in
                 zip(GRID, ddp_results["grid"], strict=True)], 2, "ddp")


def test_ddp_masters_one_fp32_all_reduce_per_step(ddp_results: dict[str, Any]) -> None:
    if os.environ.get("ACCUMGUARD_COUNT_COLLECTIVES") != "1":
        pytest.skip("collective counting is off (ACCUMGUARD_COUNT_COLLECTIVES)")
    for case, (_, colls, windows) in zip(GRID, ddp_results["grid"], strict=True):
        assert colls == windows, (case, colls, windows)  # cumulative: one per window


def test_ddp_without_masters_is_off_by_bf16_rounding(ddp_results: dict[str, Any]) -> None:
    _check_negative(list(zip(NEGATIVE, ddp_results["negative"], strict=True)), 2, "ddp")


def test_ddp_checkpoint_resume_is_bitwise(ddp_results: dict[str, Any]) -> None:
    assert ddp_results["resume"] is True


# -- state_dict, GradScaler on fp16, close ---------------------------------------------------

def test_local_state_dict_resume_is_bitwise() -> None:
    """The manual recipe (model, optimizer and Accumulator state dicts): the Accumulator's
    state carries the masters, so the resumed run continues bit for bit; without them (a
    checkpoint of a run without masters) it restarts them from bf16 and says so."""
    case = GRID[3].with_(scaler=False)
    data = make_data(case, 1)[0]

    def build() -> tuple[torch.nn.Module, Any, Accumulator]:
        model = _bf16_model(case)
        opt = make_optimizer(case, model.parameters())
        return model, opt, Accumulator(model, opt, accumulation_steps=4, count_fn=count_tokens,
                                       master_weights=True)

    model, opt, acc = build()
    for w in acc.windows(data):
        w.run(lambda b: token_loss(model, b)[0])
    whole = _weights(acc)
    model, opt, acc = build()
    windows = acc.windows(data)
    for _ in range(2):
        next(windows).run(lambda b: token_loss(model, b)[0])
    ckpt = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(),
                          "acc": acc.state_dict()})
    assert set(ckpt["acc"]["master_weights"]) == {"embed.weight", "fc1.weight", "fc1.bias",
                                                  "fc2.weight", "fc2.bias"}
    model, opt, acc = build()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    acc.load_state_dict(ckpt["acc"])
    for w in acc.windows(data[acc.micro_batches_consumed:]):
        w.run(lambda b: token_loss(model, b)[0])
    resumed = _weights(acc)
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)

    no_masters = {k: v for k, v in ckpt["acc"].items() if k != "master_weights"}
    _, _, acc = build()
    with pytest.warns(UserWarning, match="not bitwise"):
        acc.load_state_dict(no_masters)
    bf16 = _bf16_model(case)
    plain = Accumulator(bf16, make_optimizer(case, bf16.parameters()), accumulation_steps=4)
    with pytest.raises(ConfigError, match="master weights"):
        plain.load_state_dict(ckpt["acc"])


def test_fp16_parameters_with_grad_scaler() -> None:
    """fp16 parameters: GradScaler refuses to unscale fp16 gradients; with masters it
    unscales (and clips) the fp32 gradient, and the update matches the large batch."""
    case = Case(accumulation_steps=4, micro_batches=8, optimizer="sgd", scaler=True,
                max_grad_norm=1.0, seed=4)
    model = make_model(case).to(torch.float16)
    opt = make_optimizer(case, model.parameters())
    with pytest.raises(ValueError, match="FP16"):
        acc = Accumulator(model, opt, accumulation_steps=4, count_fn=count_tokens,
                          scaler=torch.amp.GradScaler("cpu"), max_grad_norm=1.0)
        next(acc.windows(make_data(case, 1)[0])).run(lambda b: token_loss(model, b)[0])
    model = make_model(case).to(torch.float16)
    snaps, acc = _train(case, model, make_data(case, 1)[0])
    assert not any(r.skipped for r in acc.history)
    ref = reference_run(make_model(case).to(torch.float16), lambda p: make_optimizer(case, p),
                        windows_for_reference(make_data(case, 1), 4), token_loss,
                        max_grad_norm=1.0)
    errors = [relative_update_error(ref.initial, s, r) for s, r in zip(snaps, ref.params,
                                                                         strict=True)]
    print(f"fp16 + GradScaler + masters vs fp64: {errors}")
    assert max(errors) <= BF16_COMPUTE_TOL / 4, errors  # fp16 has 3 more bits than bf16


def test_close_gives_the_optimizer_its_parameters_back() -> None:
    case = GRID[3].with_(scaler=False)
    model = _bf16_model(case)
    params = list(model.parameters())
    _, acc = _train(case, model, make_data(case, 1)[0][:4])
    opt = acc.optimizer
    assert opt is not None and opt.param_groups[0]["params"][0].dtype == torch.float32
    acc.close()
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in params]
    assert opt.state[params[0]]["exp_avg"].dtype == torch.bfloat16
    before = [p.detach().clone() for p in params]
    token_loss(model, make_data(case, 1)[0][0])[0].backward()
    opt.step()  # plain bf16 training again: the optimizer steps the model itself
    assert any(not torch.equal(b, p) for b, p in zip(before, params, strict=True))


# -- what is refused ----------------------------------------------------------------------------

def test_refusals_say_what_to_do_instead() -> None:
    model = _bf16_model(Case())
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ConfigError, match="accumulation_dtype='native'"):
        Accumulator(model, opt, accumulation_steps=2, master_weights=True,
                    accumulation_dtype="native")
    with pytest.raises(ConfigError, match="True or False"):
        Accumulator(model, opt, accumulation_steps=2, master_weights="yes")  # type: ignore[arg-type]
    # An optimizer that already holds state (stepped, or a checkpoint loaded into it).
    token_loss(model, make_data(Case(), 1)[0][0])[0].backward()
    opt.step()
    with pytest.raises(ConfigError, match="already holds state"):
        Accumulator(model, opt, accumulation_steps=2, master_weights=True)
    # Other engines: what gives fp32 master weights there.
    for name, fix in (("fsdp2", "reduce_dtype=torch.float32"), ("deepspeed", "grad_accum_dtype"),
                      ("zero1", "torch.autocast")):
        with pytest.raises(ConfigError, match=fix):
            enable_master_weights(SimpleNamespace(name=name), None)
    # fp32 parameters are their own masters: nothing to do.
    fp32 = make_model(Case())
    acc = Accumulator(fp32, torch.optim.SGD(fp32.parameters(), lr=0.1), accumulation_steps=2,
                      master_weights=True)
    assert acc.masters is None


def test_mixed_model_fp32_parameters_step_themselves() -> None:
    """Only bf16/fp16 parameters get masters; an fp32 parameter (e.g. a norm kept in fp32)
    stays in the optimizer as itself and receives the fp32 window sum too."""

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 2).to(torch.bfloat16)
            self.scale = torch.nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x.to(torch.bfloat16)).float() * self.scale

    torch.manual_seed(0)
    model = Mixed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acc = Accumulator(model, opt, accumulation_steps=3, master_weights=True, max_grad_norm=0.5)
    assert acc.masters is not None and acc.masters.names == ["lin.weight", "lin.bias"]
    stepped = opt.param_groups[0]["params"]
    assert any(t is model.scale for t in stepped) and len(stepped) == 3
    assert all(t.dtype == torch.float32 for t in stepped)
    data = [(torch.randn(2, 4), torch.randn(2, 2)) for _ in range(3)]
    norms: list[float] = []
    opt.register_step_pre_hook(lambda o, a, k: norms.append(float(torch.cat(
        [p.grad.flatten() for p in stepped]).norm())))
    before = model.scale.detach().clone()
    for w in acc.windows(data):
        w.run(lambda b: ((model(b[0]) - b[1]) ** 2).sum())
    assert not torch.equal(before, model.scale)
    assert norms[0] == pytest.approx(0.5, rel=1e-5)  # clipped over masters and fp32 params
    assert torch.equal(model.lin.weight, acc.masters.masters[0].to(torch.bfloat16))


def test_nonfinite_window_is_skipped_and_leaves_the_masters() -> None:
    """A NaN loss poisons the masters' fp32 gradient: the non-finite check (on the masters)
    skips the window, the masters and parameters stay, and the next window steps normally."""
    case = Case(accumulation_steps=2, micro_batches=4, seed=6)
    model = _bf16_model(case)
    acc = Accumulator(model, make_optimizer(case, model.parameters()), accumulation_steps=2,
                      count_fn=count_tokens, master_weights=True)
    assert acc.masters is not None
    start = [m.detach().clone() for m in acc.masters.masters]
    windows = acc.windows(make_data(case, 1)[0])
    with pytest.warns(UserWarning, match="non-finite loss"):
        next(windows).run(lambda b: token_loss(model, b)[0] * float("nan"))
    assert acc.history[-1].skipped
    assert all(torch.equal(a, m) for a, m in zip(start, acc.masters.masters, strict=True))
    assert all(m.grad is None for m in acc.masters.masters)
    next(windows).run(lambda b: token_loss(model, b)[0])
    assert not acc.history[-1].skipped and acc.optimizer_steps == 1
    assert all(torch.isfinite(m).all() for m in acc.masters.masters)
