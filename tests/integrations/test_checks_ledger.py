"""The collective ledger in the framework callbacks' checked steps (integrations._comm), on
real DDP (2 gloo ranks, one launch for every loop): a deferral that does nothing
(``no_sync`` around the backward only) is the EXTRA_SYNC warning with its extra all-reduces
and bytes, a correct deferral is silent, and the counts of a checked step equal the
closed form (one all-reduce of every bucket per step) also when the steps between checked
ones are not checked."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard.demo.toy import TokenMLP, make_rank_batches, token_loss
from accumguard.integrations._checks import AccumulationChecks

K = 4
DDP_OP = "all_reduce(ddp bucket)"
METRIC = 1000  # elements of the metric all-reduced at the start of every window


def _loop(rank: int, wrong: bool, every: int, windows: int,
          metric: bool = False) -> dict[str, Any]:
    torch.manual_seed(0)
    net = TokenMLP()
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grad_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    checks = AccumulationChecks(model, opt, accumulation_steps=K, logits_module=net.fc2,
                                every_n_steps=every)
    batches = make_rank_batches(seed=1, world_size=2, micro_batches=windows * K)[rank]
    checked = []
    try:
        for start in range(0, len(batches), K):
            if metric:  # a Python-level collective in every window, checked or not
                torch.distributed.all_reduce(torch.ones(METRIC))
            for i, b in enumerate(batches[start:start + K]):
                last = i == K - 1
                fwd = model.no_sync() if not last and not wrong else contextlib.nullcontext()
                with fwd:
                    s, n = token_loss(model, b)
                    loss = s / n / K
                bwd = model.no_sync() if not last and wrong else contextlib.nullcontext()
                with bwd:
                    loss.backward()
            opt.step()
            opt.zero_grad()
            last_seen = checks.comm.last
            if last_seen is not None and (not checked or checked[-1]["step"] != last_seen["step"]):
                checked.append(last_seen)
    finally:
        checks.close()
    # the loss here is a mean per micro-batch (the token-weight checks may say F5 of it):
    # only the ledger's finding is read
    found = [(f.cls, f.severity.value, f.title, f.evidence) for f in checks.findings
             if f.cls == "EXTRA_SYNC"]
    return {"found": found, "checked": checked, "grad_bytes": grad_bytes}


def _all(rank: int, world: int) -> dict[str, Any]:
    return {"noop": _loop(rank, True, 1, 2), "correct": _loop(rank, False, 1, 2),
            "sampled": _loop(rank, False, 3, 8, metric=True)}


@pytest.fixture(scope="module")
def results(torch_spawn: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The 2 ranks of ``_all``, run in the session's shared gloo spawn
    (``ds_spawn.TORCH_WORKERS``)."""
    out: list[dict[str, Any]] = torch_spawn["test_checks_ledger"]
    return out


def _ddp_rows(step: dict[str, Any]) -> list[tuple[int, int, int]]:
    return [(micro, calls, nbytes) for op, micro, _in_bw, calls, nbytes, _s in step["rows"]
            if op == DDP_OP]


def test_a_noop_deferral_is_a_warning_with_its_cost(results: list[dict[str, Any]]) -> None:
    for rank in (0, 1):
        r = results[rank]["noop"]
        (cls, severity, title, evidence), = r["found"]  # said once
        assert (cls, severity) == ("EXTRA_SYNC", "warning"), r["found"]
        assert title.startswith("deferral that does nothing: 3 extra collective(s)"), title
        assert "no_sync() was entered after the forward" in evidence
        # every micro-step all-reduced the whole gradient: 4x its bytes per step
        for step in r["checked"]:
            assert sum(b for _m, _c, b in _ddp_rows(step)) == 4 * r["grad_bytes"], step


def test_a_correct_deferral_is_silent_and_matches_the_closed_form(
        results: list[dict[str, Any]]) -> None:
    for rank in (0, 1):
        for loop in ("correct", "sampled"):
            r = results[rank][loop]
            assert r["found"] == [], r["found"]
            assert r["checked"], loop
            for step in r["checked"]:
                rows = _ddp_rows(step)
                # the closed form: every bucket all-reduced once, inside the last backward
                assert [m for m, _c, _b in rows] == [K - 1], step
                assert sum(b for _m, _c, b in rows) == r["grad_bytes"], step
        # one step in 3 checked (of 8): a checked step's ledger holds its own window's
        # metric all-reduce, not the unchecked windows' before it
        sampled = results[rank]["sampled"]["checked"]
        assert 2 <= len(sampled) < 8 and sampled[-1]["step"] > 1, sampled
        for step in sampled:
            other = [(calls, nbytes) for op, _m, _b, calls, nbytes, _s in step["rows"]
                     if op == "all_reduce"]
            assert other == [(1, METRIC * 4)], step
