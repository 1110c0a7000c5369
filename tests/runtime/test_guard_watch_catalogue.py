"""Every loop of the demo catalogue judged by the runtime guard and by ``watch``'s rules in
the same run, with the same answer.

:func:`accumguard.demo.loops.catalog` holds the Accumulator, the correct hand-written loops
and the broken ones on every engine (DDP, torch ZeRO-1, FSDP2 both ways, DeepSpeed ZeRO-1/2/3).
ONE spawn of 2 gloo ranks runs each loop once: the guard (``mode="warn"``, K and the run's
micro-batch count declared) is installed on the engine the loop wraps, and the same run is
recorded as ``watch`` records it (:func:`accumguard.watch._recording.recording`); the recording
is then judged as the ``watch`` CLI judges it (:func:`accumguard.watch._report.judge`,
``--accumulation-steps K``). Both must name the same failure classes at error level: the
class the catalogue says for a broken loop, nothing for a correct one.

A class one of them cannot judge is listed in :data:`ONLY_WATCH` with the reason, and checked
for what is true instead (``watch`` names it, the guard stays silent, never a wrong class).
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from accumguard import run_on_ranks
from accumguard.demo import loops as catalogue
from accumguard.demo.demo import demo_setup
from accumguard.demo.loops import CatalogLoop, Wrapped, catalog, engine_available
from accumguard.runtime.guard import AccumulationGuard
from accumguard.verify.contract import LoopContext

K = 4
STEPS = 3
WORLD = 2

#: broken-loop class -> why only ``watch`` can judge it
ONLY_WATCH: dict[str, str] = {
    "F5": "a loss normalised per micro-batch (mean / K) with uneven token counts is a wrong "
          "weight per token, read from the loss record watch keeps; the guard counts events "
          "(backward, step, clip, sync...) and never sees a loss, so it must stay silent",
}

#: per loop and rank: (the guard's error classes, its note kinds, windows it closed, error)
Judged = tuple[list[str], list[str], int, str]


def _dir(key: str) -> str:
    return key.replace("/", "__")


def _loops() -> list[CatalogLoop]:
    return catalog()


def _run_all(rank: int, world: int, out: str) -> dict[str, Judged]:
    """Run every available catalogue loop once on this rank, guarded and recorded."""
    from accumguard.runtime.guard import guard
    from accumguard.watch._recording import recording

    setup = demo_setup(model="mlp", steps=STEPS, accumulation_steps=K)
    real_wrap = catalogue.wrap_engine
    results: dict[str, Judged] = {}
    for c in _loops():
        if engine_available(c.engine) is not None:
            continue
        guards: list[AccumulationGuard] = []

        def wrap_and_guard(ctx: LoopContext, engine: str, *, ds_ga: int = 1,
                           ds_clipping: bool = True,
                           guards: list[AccumulationGuard] = guards) -> Wrapped:
            w = real_wrap(ctx, engine, ds_ga=ds_ga, ds_clipping=ds_clipping)
            g = guard(w.model, None if w.deepspeed else w.optimizer,
                      accumulation_steps=ctx.accumulation_steps, scheduler=w.scheduler,
                      mode="warn", total_micro_batches=len(ctx.batches))
            guards.append(g.install())
            return w

        ctx = LoopContext(rank=rank, world_size=world, setup=setup, model=setup.build_model(),
                          batches=list(setup.rank_batches(rank, world))[:STEPS * K],
                          device=torch.device("cpu"))
        error = ""
        catalogue.wrap_engine = wrap_and_guard
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with recording(Path(out) / _dir(c.key)):
                    c.loop(ctx)
                for g in guards:
                    g.close()
        except Exception as exc:  # noqa: BLE001 - reported per loop by the test
            error = f"{type(exc).__name__}: {exc}"
        finally:
            catalogue.wrap_engine = real_wrap
        results[c.key] = ([v.rule for g in guards for v in g.violations],
                          [n.kind for g in guards for n in g.notes],
                          sum(g.windows_closed for g in guards), error)
    return results


@pytest.fixture(scope="module")
def runs() -> tuple[Path, list[dict[str, Judged]]]:
    out = Path(tempfile.mkdtemp(prefix="guard-watch-catalogue-"))
    return out, run_on_ranks(_run_all, WORLD, (str(out),), timeout=1500)


@pytest.mark.parametrize("loop", _loops(), ids=lambda c: c.key)
def test_guard_and_watch_name_the_same_class(runs: tuple[Path, list[dict[str, Judged]]],
                                             loop: CatalogLoop) -> None:
    from accumguard.watch._report import judge

    why = engine_available(loop.engine)
    if why is not None:
        pytest.skip(f"{loop.engine} cannot run here: {why}")
    out, by_rank = runs
    assert not any(r[loop.key][3] for r in by_rank), [r[loop.key][3] for r in by_rank]
    # the guard saw the loop's windows (its silence on a correct loop is a verdict)
    assert all(r[loop.key][2] >= STEPS for r in by_rank), [r[loop.key][2] for r in by_rank]
    by_guard = {cls for r in by_rank for cls in r[loop.key][0]}
    result = judge(out / _dir(loop.key), accumulation_steps=K)
    by_watch = {f.cls for f in result.findings if f.severity == "error"}
    expected = set() if loop.expected == "pass" else {loop.expected}
    if loop.expected in ONLY_WATCH:
        assert by_watch == expected and by_guard == set(), (by_guard, by_watch)
    elif loop.expected == "F1":
        # the F1 loop divides each micro-batch's mean (the ranks' token counts differ) by K and
        # DDP/FSDP averages the ranks: each rank normalised by its own count, F6, which only
        # watch's loss-weight ledger judges; true beside F1, never instead of it
        assert by_guard == expected and expected <= by_watch <= {"F1", "F6"}, (by_guard, by_watch)
    else:
        assert by_guard == by_watch == expected, (by_guard, by_watch)
