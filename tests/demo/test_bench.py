"""accumguard bench: the limit is the large-batch step, the paired statistics decide a bar
only when the interval allows it, and the paired / ZeRO-study modes run end to end.

The two checks on the bench's own builders (the limit against DDP, then ZeRO-3's
replacement of ``F.linear``) and the ZeRO-3 study's "every parameter whole" variant run one
after the other in ONE 2-rank spawn (module fixture ``builders``; they had a spawn each).
The study's "coalesced" variant runs end to end through ``bench.main`` (its own spawn)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from accumguard import run_on_ranks
from accumguard.demo import bench
from accumguard.demo._bench_zero import _GATHERS, ZERO3_VARIANTS


def _rounds(ratio: float, spread: float, n: int, seed: int = 0) -> list[list[float]]:
    """Synthetic paired rounds: the limit drifts (a noisy machine), C = ratio × limit × noise."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.uniform(0.3, 0.9), rng.uniform(0.3, 0.9)
        c = ratio * (a + b) / 2 * rng.uniform(1 - spread, 1 + spread)
        out.append([c, a, b, c, a, b])
    return out


def test_verdict_follows_the_interval_not_the_median() -> None:
    assert bench.verdict((0.98, 1.04), 1.05) == "met"
    assert bench.verdict((1.06, 1.10), 1.05) == "not met"
    assert bench.verdict((1.00, 1.07), 1.05) == "undecidable"
    assert bench.verdict((1.00, 1.07), None) == "-"


def test_paired_summary_recovers_the_ratio_despite_a_drifting_limit() -> None:
    rows = bench.paired_summary({"fast": _rounds(1.00, 0.02, 30), "slow": _rounds(1.30, 0.02, 30),
                                 "noisy": _rounds(1.05, 0.30, 30)},
                                {"fast": 1.05, "slow": 1.2, "noisy": 1.05})
    by = {r["configuration"]: r for r in rows}
    # The limit itself varies 3x between rounds; the per-round ratio removes that.
    assert by["fast"]["ratio"] == pytest.approx(1.0, abs=0.02)
    assert by["fast"]["ci95"][0] <= 1.0 <= by["fast"]["ci95"][1]
    assert by["fast"]["verdict"] == "met"
    assert by["slow"]["verdict"] == "not met"
    assert by["noisy"]["verdict"] == "undecidable"
    assert by["fast"]["cpu_verdict"] == "met" and by["slow"]["cpu_verdict"] == "not met"
    assert by["noisy"]["ci95"][1] - by["noisy"]["ci95"][0] > 0.05
    # Seeded bootstrap: the same data give the same interval.
    again = bench.paired_summary({"noisy": _rounds(1.05, 0.30, 30)}, {})
    assert again[0]["ci95"] == by["noisy"]["ci95"]


def _limit_vs_ddp(rank: int, world: int) -> dict[str, Any]:
    args = argparse.Namespace(dim=8, hidden=16, k=3, micro=4)
    batches = bench.make_batches(rank, args.k, args.micro, args.dim)
    out: dict[str, Any] = {}
    for name, build in (("limit", lambda: bench._build_local(args, with_allreduce=True)),
                        ("ddp", lambda: bench._build_ddp(args, "deferred"))):
        run = build()
        params = list(run.model.parameters())
        before = torch.cat([p.detach().flatten().double() for p in params])
        run(batches)
        out[name] = torch.cat([p.detach().flatten().double() for p in params]) - before
    return out


def _builders(rank: int, world: int, with_deepspeed: bool) -> dict[str, Any]:
    """Both builder checks in the same ranks: the limit vs DDP first (no DeepSpeed yet in
    the process), then the ZeRO-3 ``F.linear`` check."""
    out: dict[str, Any] = {"limit_vs_ddp": _limit_vs_ddp(rank, world)}
    if with_deepspeed:
        out["linear_seen"] = _linear_seen(rank, world)
        out["whole_ops"] = bench.zero_study_worker(rank, world, _ZERO_STUDY_ARGS, 3,
                                                   *ZERO3_VARIANTS[_WHOLE])["per_step"]
    return out


@pytest.fixture(scope="module")
def builders() -> list[dict[str, Any]]:
    import importlib.util

    with_ds = importlib.util.find_spec("deepspeed") is not None
    return run_on_ranks(_builders, 2, (with_ds,), timeout=720, env={"DS_ACCELERATOR": "cpu"})


def test_limit_takes_the_same_step_as_the_accumulator_on_ddp(
        builders: list[dict[str, Any]]) -> None:
    """The denominator is the same computation as the numerator (same model, data, optimizer,
    the large-batch gradient), only without accumguard and with one bare all-reduce."""
    res = [r["limit_vs_ddp"] for r in builders]
    for r in res:
        limit, ddp = r["limit"], r["ddp"]
        assert ddp.norm() > 0
        # fp32 training, one AdamW step: the update agrees to fp32 rounding (mission: 1e-5).
        assert float((limit - ddp).norm() / ddp.norm()) < 1e-5
    assert torch.equal(res[0]["limit"], res[1]["limit"])  # replicas stay identical


def test_paired_mode_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "paired.json"
    code = bench.main(["--paired", "--rounds", "3", "--warm", "1", "--dim", "8", "--hidden",
                       "16", "-k", "2", "--micro", "2", "--no-deepspeed", "--only",
                       "DDP deferred", "--json", str(out), "--timeout", "300"])
    assert code == 0
    text = capsys.readouterr().out
    assert "load average" in text and "| DDP deferred |" in text
    doc = json.loads(out.read_text())
    names = {r["configuration"] for r in doc["rows"]}
    assert {"local (compute only)", "DDP deferred"} <= names and bench.LIMIT not in names
    ddp = next(r for r in doc["rows"] if r["configuration"] == "DDP deferred")
    assert ddp["bar"] == 1.05 and ddp["verdict"] in ("met", "not met", "undecidable")
    assert ddp["rounds"] == 3 and len(doc["samples"]["DDP deferred"]) == 3



def test_only_exact_keeps_the_named_rows_and_the_references() -> None:
    """``--only NAME --exact`` keeps that configuration alone (with the limit and compute-only
    rows), not the variants whose names extend it; without ``--exact`` they stay."""
    from accumguard.demo._bench_setup import configurations

    base = {"dim": 8, "hidden": 16, "k": 2, "micro": 2, "no_deepspeed": True,
            "only": ["DDP deferred"]}
    loose = set(configurations(argparse.Namespace(**base)))
    exact = set(configurations(argparse.Namespace(**base, exact=True)))
    refs = {"local (compute only)", bench.LIMIT}
    assert exact == refs | {"DDP deferred"}
    assert loose > exact and "DDP deferred, counting comm hook" in loose

# dim 64 / hidden 512: the 512x512 weight (262 k elements) is above ZeRO-3's default
# persistence threshold (1e5), so the plain coalesced variant gathers it in every micro-step;
# persistence 1e12 keeps every parameter whole and must gather less.
_ZERO_STUDY_ARGS = argparse.Namespace(rounds=1, warm=1, dim=64, hidden=512, k=3, micro=2)
_SHARDED = "coalesced (config GA = 1)"
_WHOLE = "coalesced, persistence 1e12 (every parameter whole)"


def test_zero3_study_counts_gathers_and_reductions(
        capsys: pytest.CaptureFixture[str], builders: list[dict[str, Any]]) -> None:
    """The study end to end (``bench.main``, its own spawn) for the coalesced variant; the
    "every parameter whole" variant's worker ran in the ``builders`` spawn with the same
    sizes (it had a spawn of its own through ``bench.main`` before)."""
    pytest.importorskip("deepspeed")
    a = _ZERO_STUDY_ARGS
    args = ["--zero-study", "3", "--rounds", str(a.rounds), "--warm", str(a.warm), "--dim",
            str(a.dim), "--hidden", str(a.hidden), "-k", str(a.k), "--micro", str(a.micro),
            "--timeout", "300", "--only", _SHARDED]
    assert bench.main(args) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ZeRO-3")]
    assert len(lines) == 1, lines
    sharded = lines[0].split("|")
    assert sharded[1].strip() == f"ZeRO-3 {_SHARDED}", sharded
    gathers = {"sharded": float(sharded[5].split("(")[0]),
               "whole": sum(builders[0]["whole_ops"].get(o, [0, 0])[0] for o in _GATHERS)}
    assert gathers["sharded"] >= 3  # the 512x512 weight is gathered in every micro-step
    assert gathers["whole"] < gathers["sharded"], gathers
    assert float(sharded[6].split("(")[0]) >= 1  # at least one gradient reduction per step


def _linear_seen(rank: int, world: int) -> dict[str, list[str]]:
    """Which ``F.linear`` each configuration's Linear layers call during its own steps."""
    from accumguard.demo import _bench_setup as setup

    setup._setup_worker()
    args = argparse.Namespace(k=2, micro=2, dim=8, hidden=16)
    seen: dict[str, list[str]] = {"zero3": [], "limit": []}
    zero3 = setup._build_deepspeed(args, 3, "deferred", "unsharded")
    after_build = torch.nn.functional.linear is setup._TORCH_LINEAR
    limit = setup._build_local(args, with_allreduce=True)
    for name, run in (("zero3", zero3), ("limit", limit)):
        for layer in run.model.modules():  # type: ignore[attr-defined]  # set for the tests
            if isinstance(layer, torch.nn.Linear):
                layer.register_forward_hook(lambda *_, n=name: seen[n].append(
                    torch.nn.functional.linear.__name__))
        run(setup.make_batches(rank, 2, 2, 8))
    seen["after"] = [str(after_build), str(torch.nn.functional.linear is setup._TORCH_LINEAR)]
    return seen


def test_zero3_replacement_of_linear_stays_in_its_own_rows(
        builders: list[dict[str, Any]]) -> None:
    """DeepSpeed ZeRO-3 replaces ``torch.nn.functional.linear`` for the whole process; the
    bench's limit (and every other row) must still run torch's own, as without DeepSpeed."""
    pytest.importorskip("deepspeed")
    for seen in (r["linear_seen"] for r in builders):
        assert set(seen["zero3"]) == {"zero3_linear_wrap"}, seen
        assert set(seen["limit"]) == {"linear"}, seen
        assert seen["after"] == ["True", "True"], seen
