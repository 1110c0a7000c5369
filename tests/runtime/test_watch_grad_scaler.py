"""GradScaler runs (fp16 on GPU; the CPU GradScaler here): a step the scaler skips for
inf/NaN gradients ends its window with the gradients dropped. Before, the observer folded
the skipped windows into the next one and counted no optimizer step, so a correct loop
whose first steps overflow (as fp16 runs do) read as a scheduler stepping twice per
optimizer step (F4, error) under ``watch``; the framework callbacks, which read the scaled
dL/dlogits, saw a constant loss scale (LOSS_SCALE) and a window of 2K backwards."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from accumguard.integrations._checks import AccumulationChecks

V, K = 16, 2


def _loop(skips: tuple[int, ...], *, bug: str = "", windows: int = 8,
          init_scale: float = 1024.0, accelerate: bool = False,
          attach: Callable[[torch.nn.Module, Any], Any] | None = None) -> Any:
    """A GradScaler loop with an exact token loss; ``skips``: windows whose first micro-step
    overflows. ``bug``: "sched_per_micro" steps the scheduler after every micro-step (F4),
    "mean" averages each micro-batch (F5 with uneven counts). ``attach(model, opt)`` runs
    before the loop; its result is returned. ``accelerate``: the optimizer is Accelerate's
    ``AcceleratedOptimizer`` holding the scaler (its ``step`` runs ``scaler.step`` and
    ``scaler.update``), the path of HF Trainer and Accelerate with fp16 on GPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(V, 8), torch.nn.Linear(8, V))
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: 1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    opt: Any = inner
    if accelerate:
        from accelerate import Accelerator
        from accelerate.optimizer import AcceleratedOptimizer

        Accelerator(cpu=True)  # the state AcceleratedOptimizer reads
        opt = AcceleratedOptimizer(inner, device_placement=False, scaler=scaler)
    attached = attach(model, opt) if attach is not None else None
    g = torch.Generator().manual_seed(1)
    for w in range(windows):
        rows = [1 + (w + m) % 3 for m in range(K)]  # uneven token counts per micro-step
        total = 5 * sum(rows)
        for m, r in enumerate(rows):
            x = torch.randint(0, V, (r, 5), generator=g)
            y = torch.randint(0, V, (r, 5), generator=g)
            s = torch.nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1),
                                                  reduction="sum")
            loss = s / (5 * r) / K if bug == "mean" else s / total
            if w in skips and m == 0:
                loss = loss * float("inf")  # an overflow: the scaler skips this step
            scaler.scale(loss).backward()
            if bug == "sched_per_micro":
                sched.step()
        scaler.unscale_(inner)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if accelerate:
            opt.step()  # scaler.step(inner) and scaler.update() inside
        else:
            scaler.step(opt)
            scaler.update()
        if bug != "sched_per_micro":
            sched.step()
        opt.zero_grad()
    return attached


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: scheduler before optimizer step
@pytest.mark.parametrize(("skips", "bug", "want"), [
    ((0, 1, 2), "", set()),           # overflows at the start, then fine: silent
    ((), "", set()),
    ((0, 1), "sched_per_micro", {"F4"}),  # a real scheduler bug is still an error
])
def test_watch_skipped_scaler_steps_end_their_window(tmp_path: Path, skips: tuple[int, ...],
                                                     bug: str, want: set[str]) -> None:
    from accumguard.watch._findings import analyze, load_recordings
    from accumguard.watch._recording import recording

    with recording(tmp_path):
        _loop(skips, bug=bug)
    recs = load_recordings(tmp_path)
    steps = recs.steps[0]
    assert [s["discarded"] for s in steps] == [w in skips for w in range(8)]
    findings, _, _ = analyze(recs)
    assert {f.cls for f in findings if f.severity == "error"} == want, findings


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("accelerate", [False, True])
@pytest.mark.parametrize("every", [1, 10])
@pytest.mark.parametrize(("bug", "want"), [("", []), ("mean", ["F5"])])
def test_callbacks_read_the_probe_unscaled_and_drop_skipped_windows(
        caplog: pytest.LogCaptureFixture, every: int, bug: str, want: list[str],
        accelerate: bool) -> None:
    caplog.set_level(logging.ERROR, "accumguard")
    found: list[str] = []

    def attach(model: torch.nn.Module, opt: Any) -> AccumulationChecks:
        return AccumulationChecks(model, opt, accumulation_steps=K, every_n_steps=every,
                                  on_finding=lambda f: found.append(f.class_id))

    checks = _loop((0, 3), bug=bug, windows=12, init_scale=2.0 ** 14, attach=attach,
                   accelerate=accelerate)
    checks.close()
    assert checks.steps == 12  # 12 windows, 2 skipped by the scaler: attempted steps
    assert sorted(set(found)) == want, found


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_findings_of_one_window_after_a_skipped_step_carry_one_step_number() -> None:
    # A skipped step counts (as the observer and the frameworks' global_step count it): the
    # probe's F5 and the observation layer's F8 of the same window name the same step.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(V, 8), torch.nn.Linear(8, V))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    g = torch.Generator().manual_seed(1)
    with AccumulationChecks(model, opt, accumulation_steps=K) as checks:
        for w in range(3):
            for m in range(K):
                r = 1 + (w + m) % 3
                x = torch.randint(0, V, (r, 5), generator=g)
                y = torch.randint(0, V, (r, 5), generator=g)
                loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, V),
                                                         y.reshape(-1)) / K  # F5
                if w == 0 and m == 0:
                    loss = loss * float("inf")  # the scaler skips optimizer step 1
                scaler.scale(loss).backward()
                if w == 2 and m == 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)  # F8
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    got = [(f.step, f.class_id) for f in checks.findings]
    assert got == [(2, "F5"), (3, "F5"), (3, "F8")], got


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sampled_window_the_scaler_skipped_hands_its_sample_to_the_next() -> None:
    # 1-in-10 sampling: step 0 is sampled; fp16 runs skip their first steps, so without the
    # hand-off the observation layer would first look at step 19
    from accumguard.observe import Observer

    steps: list[tuple[int, bool]] = []

    class Listener:
        def on_step(self, ev: Any) -> None:
            steps.append((ev.step, ev.discarded))

    def attach(model: torch.nn.Module, opt: Any) -> Observer:
        obs = Observer(roots=[model], every=10, sampled_records=True, window_size=K)
        obs.add_listener(Listener())
        return obs.install()

    obs = _loop((0, 1), windows=5, attach=attach)
    obs.uninstall()
    # 0 and 1 skipped (recorded, discarded), 2 inherits the sample; 3 and 4 not sampled
    assert steps == [(0, True), (1, True), (2, False)], steps
