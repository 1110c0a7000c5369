"""The guard and ``watch`` judge one contract: on the same loop they must name the same
class (or both stay silent). One catalogue of loops, single process and 2 DDP ranks, each
run once under ``guard(mode="warn")`` and once recorded as under ``watch``.

Classes only one of them can see are listed, not compared: the guard has no loss record
(F5, LOSS_SCALE are judged from per-token weights by ``watch``), and ``watch`` judges
nothing before the step runs (the guard's point)."""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from accumguard.runtime.guard import guard
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K = 4


def _data(rank: int = 0, n: int = 3 * K) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1 + rank)
    return [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g))
            for _ in range(n)]


def _build() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, 2)


def _loop(bug: str | None, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
          rank: int = 0) -> None:
    """One hand-written loop with at most one bug (the class the loop name says)."""
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    for i, (x, y) in enumerate(_data(rank)):
        last = (i + 1) % K == 0
        if bug == "F3":
            opt.zero_grad()
        sync: Any = model.no_sync() if ddp and not last \
            and bug not in ("F1", "F11", "EXTRA_SYNC") else contextlib.nullcontext()
        with sync:
            out = model(x)
            if ddp and bug == "F11":
                model.require_backward_grad_sync = last  # after the forward: too late
            loss = torch.nn.functional.cross_entropy(out, y, reduction="sum") / (5 * K)
            loss.backward()
        if bug == "GREW":  # a weight-decay gradient added after every backward
            with torch.no_grad():
                for p in model.parameters():
                    p.grad.add_(p, alpha=0.01)
        if bug == "F8":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if bug == "F4":
            sched.step()
        if last or bug == "F1":
            if bug != "F8":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            if bug != "F4":
                sched.step()
            if bug != "F7":
                opt.zero_grad()


def _both(bug: str | None, rank: int = 0,
          wrap: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m
          ) -> tuple[set[str], set[str], set[str]]:
    """The guard's error classes, the recording's directory, and the guard's note kinds."""
    model, opt, sched = _build()
    model = wrap(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = guard(model, opt, accumulation_steps=K, scheduler=sched, mode="warn")
        with g:
            _loop(bug, model, opt, sched, rank)
    by_guard = {v.rule for v in g.violations}
    model, opt, sched = _build()
    model = wrap(model)
    out = Path(tempfile.mkdtemp(prefix=f"agree-{bug}-r{rank}-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with recording(out):
            _loop(bug, model, opt, sched, rank)
    notes = {n.kind for n in g.notes}
    return by_guard, {str(out)}, notes  # the recording is judged once every rank wrote it


def _judge(dirs: list[str], severity: str = "error") -> set[str]:
    found: set[str] = set()
    # single process: one directory; DDP: one directory per rank, read together
    merged = Path(tempfile.mkdtemp(prefix="agree-merged-"))
    for d in dirs:
        for f in Path(d).glob("rank-*.jsonl"):
            (merged / f.name).write_bytes(f.read_bytes())
    findings, _, _ = analyze(load_recordings(merged), k_flag=K)
    found |= {f.cls for f in findings if f.severity == severity}
    return found


@pytest.mark.parametrize("bug", [None, "F1", "F3", "F4", "F7", "F8"])
def test_guard_and_watch_name_the_same_class_single_process(bug: str | None) -> None:
    by_guard, dirs, _ = _both(bug)
    by_watch = _judge(sorted(dirs))
    assert by_guard == by_watch == ({bug} if bug else set())


def test_guard_and_watch_both_only_warn_on_a_gradient_grown_between_backwards() -> None:
    """A term added to .grad after every backward: right if divided by K, K times too much if
    not; neither can tell, so neither makes an error (both said F3 before), and both say it
    (the guard's LOSS_SCALE note, watch's LOSS_SCALE warning): ``_shared_rules.grew``."""
    by_guard, dirs, notes = _both("GREW")
    assert by_guard == set() and _judge(sorted(dirs)) == set()
    assert "note_grad_grew" in notes
    assert _judge(sorted(dirs), severity="warning") == {"LOSS_SCALE"}


def _ddp_rank(rank: int, world: int) -> dict[str, tuple[set[str], set[str], set[str]]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return {str(bug): _both(bug, rank, DDP) for bug in (None, "F1", "F3", "F11", "EXTRA_SYNC")}


@pytest.fixture(scope="module")
def ddp_runs(torch_spawn: dict[str, list[Any]]
             ) -> list[dict[str, tuple[set[str], set[str], set[str]]]]:
    """The 2 ranks of ``_ddp_rank``, run in the session's shared gloo spawn
    (``ds_spawn.TORCH_WORKERS``)."""
    out: list[dict[str, tuple[set[str], set[str], set[str]]]] = torch_spawn[
        "test_guard_watch_agree"]
    return out


@pytest.mark.parametrize("bug", ["None", "F1", "F3", "F11"])
def test_guard_and_watch_name_the_same_class_on_ddp(ddp_runs: list, bug: str) -> None:
    by_guard = set().union(*(r[bug][0] for r in ddp_runs))
    by_watch = _judge(sorted(d for r in ddp_runs for d in r[bug][1]))
    assert by_guard == by_watch == (set() if bug == "None" else {bug}), (by_guard, by_watch)


def test_guard_and_watch_both_note_every_micro_step_syncing_on_ddp(ddp_runs: list) -> None:
    """A DDP loop without no_sync all-reduces on every micro-step: correct, wasteful. The
    guard (a note per micro-step, before its backward) and watch (an EXTRA_SYNC note over the
    window; a warning once the collective ledger measured the extra calls) decide it with the
    same rule (``observe._shared_rules.micro_sync``)."""
    by_guard = set().union(*(r["EXTRA_SYNC"][0] for r in ddp_runs))
    guard_notes = set().union(*(r["EXTRA_SYNC"][2] for r in ddp_runs))
    dirs = sorted(d for r in ddp_runs for d in r["EXTRA_SYNC"][1])
    assert by_guard == _judge(dirs) == set()
    assert "note_extra_sync" in guard_notes
    # (a warning when the collective ledger measured the extra calls, else a note)
    assert "EXTRA_SYNC" in _judge(dirs, "warning") | _judge(dirs, "note")
    # a loop that defers the sync draws neither
    none_notes = set().union(*(r["None"][2] for r in ddp_runs))
    assert "note_extra_sync" not in none_notes
    none_dirs = sorted(d for r in ddp_runs for d in r["None"][1])
    assert "EXTRA_SYNC" not in _judge(none_dirs, "warning") | _judge(none_dirs, "note")
