"""Loop shapes off the demo catalogue on which the guard and ``watch`` once named different
classes, with their correct twins: both must name the same class at error level, or both
stay silent (the side that cannot know gives at most a note).

Each shape is one plan of events, judged twice in process: the guard's state machine
(:class:`accumguard.runtime._guard_machine.GuardMachine`) takes the events one by one,
``watch``'s rules (:func:`accumguard.observe.rules.analyze`) take the same windows as the
step records a recording holds. The decisions are shared
(:mod:`accumguard.observe._shared_rules`: ``short_window``, ``continues_saved_window``,
``step_without_backward``, ``long_window_class``). A few shapes also run as real torch loops
(one process, no spawn) under ``guard`` and ``watch``'s recording, for the observer's side
of the facts (a DataLoader pass, a gradient left in ``.grad``)."""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from accumguard.core.window import Conservation, StepRecord
from accumguard.observe.rules import RunRecording, analyze
from accumguard.runtime._guard_machine import GuardMachine
from accumguard.watch._findings import merge_ranks

K = 4
#: the restored partial window of a resumed run, as the conservation check sees it
_STALE = Conservation(params=2, wiped=0.0, stale=0.5, received=0.5, ok=False, reason="stale")


def _guard_plan(plan: str) -> GuardMachine:
    """Feed ``plan`` to the guard's state machine: ``b`` a backward, ``B`` a backward that
    begins a new DataLoader pass, ``R`` the run's first backward on a restored gradient,
    ``s`` a step (then zero_grad), ``S`` a second step with the gradient still set (then
    zero_grad), ``n`` a second step after zero_grad (every gradient None: a no-op),
    ``k`` a step a GradScaler skipped (then zero_grad)."""
    g = GuardMachine(accumulation_steps=K, mode="warn", sync="deferred",
                     total_micro_batches=None, history=64, rank=None)
    first = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for e in plan:
            if e in "bBR":
                g.backward(new_pass=e == "B", grads_set=(lambda: True) if e == "R" else None)
            elif e == "s":
                g.step(conservation=_STALE if first and "R" in plan else None)
                first = False
                g.zero_grad()
            elif e in "Sn":
                g.step(moved=True if e == "S" else None, applied=e == "S")
                g.zero_grad()
            elif e == "k":
                g.skipped_step()
                g.zero_grad()
        g.final_checks()
    return g


def _records(plan: str) -> list[StepRecord]:
    """The step records ``watch`` writes for ``plan`` (see :func:`_guard_plan`)."""
    out: list[StepRecord] = []
    n, starts = 0, []
    for e in plan:
        if e in "bBR":
            if e == "B":
                starts.append(n)
            n += 1
            continue
        if e not in "sSnk":
            continue
        cons = _STALE if not out and "R" in plan else None
        out.append(StepRecord(step=len(out), backwards=n, data_pass_starts=starts,
                              applied=e in "sS", discarded=e == "k", conservation=cons,
                              moved_without_backward=(e == "S") if n == 0 else None))
        n, starts = 0, []
    return out


def _both(plan: str, ranks: int = 1) -> tuple[set[str], set[str], list[str]]:
    """The guard's error classes, ``watch``'s (K given as ``--accumulation-steps``), and the
    guard's note kinds."""
    g = _guard_plan(plan)
    rows = [r.as_dict(rank=0) for r in _records(plan)]
    rec = RunRecording(steps={0: rows}, world=ranks)
    found, _, _ = analyze(rec, k_flag=K)
    return ({v.rule for v in g.violations}, {f.cls for f in found if f.severity == "error"},
            [n.kind for n in g.notes])


def _w(*sizes: int, pass_start: bool = False) -> str:
    """Windows of ``sizes`` backward passes, each closed by a step; ``pass_start``: the
    first backward begins a DataLoader pass."""
    plan = "".join("b" * n + "s" for n in sizes)
    return ("B" + plan[1:]) if pass_start else plan


#: per case: the plan, the class both must name (None: both silent at error level)
SHAPES: dict[str, tuple[str, str | None]] = {
    # a. a step after 2 or 3 of K backwards in the middle of a DataLoader pass
    "a_early_step_in_a_pass_2": (_w(4, 4, 2, 4, 4, pass_start=True), "F13"),
    "a_early_step_in_a_pass_3": (_w(4, 3, 4, 4, pass_start=True), "F13"),
    # a, twin: the same windows with no DataLoader: an epoch's tail or an early step,
    # nothing tells them apart (the guard notes it)
    "a_twin_no_dataloader": (_w(4, 4, 2, 4, 4), None),
    # b. the first window short: `i % K == 0` from i = 0, `(i + 1) % K` from i = 1
    "b_first_window_of_1": (_w(1, 4, 4, 4), "F13"),
    "b_first_window_of_3": (_w(3, 4, 4, 4), "F13"),
    "b_first_window_of_3_dataloader": (_w(3, 4, 4, 4, pass_start=True), "F13"),
    # b, twin: a resumed run that restored the saved partial window's gradient
    "b_twin_resumed_partial_window": ("R" + _w(2, 4, 4)[1:], None),
    # ... and the resume that restored only the counter, not the gradient: F13
    "b_resumed_without_the_gradient": (_w(2, 4, 4), "F13"),
    # windows of one backward: a step per micro-step (F1, from the first two)
    "f1_every_micro_step": (_w(1, 1, 1, 1, 1, 1), "F1"),
    # c. a second step with the gradient still in .grad: applied twice
    "c_step_without_backward": ("b" * 4 + "sS" + _w(4, 4), "EXTRA_STEP"),
    # c, twin: a second step after zero_grad: every gradient None, a no-op
    "c_twin_noop_second_step": ("b" * 4 + "sn" + _w(4, 4), None),
    # d. a per-epoch counter over epochs of 10: the 2 left over join the next epoch's window
    "d_leftover_joins_next_epoch": (("B" + "b" * 3 + "s" + "b" * 4 + "s" + "bb") * 3, "F7"),
    # d, twin: each epoch's tail of 2 flushed at the epoch's end
    "d_twin_epoch_tail_flushed": (("B" + "bbbsbbbbsbbs") * 3, None),
    # twin: the run's last window short (no DataLoader, nothing declared)
    "twin_final_partial_window": (_w(4, 4, 2), None),
    # twin: a GradScaler skipped a step (inf gradient): the window ended, nothing carried
    "twin_gradscaler_skip": ("b" * 4 + "s" + "b" * 4 + "k" + _w(4, 4), None),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_guard_and_watch_name_the_same_class(case: str) -> None:
    plan, expected = SHAPES[case]
    if plan.endswith("bb"):  # (d) the run's last leftover: step on it, as the epoch's end
        plan += "s"
    by_guard, by_watch, notes = _both(plan)
    want = set() if expected is None else {expected}
    assert by_guard == by_watch == want, (by_guard, by_watch)
    if case == "a_twin_no_dataloader":
        assert notes == ["note_short_window"]


def test_the_guard_reports_a_short_window_at_that_window() -> None:
    """The guard judges a short window once the next one closed (only then is an epoch's
    end, the run's end or a step per micro-step told apart), and names the short one."""
    g = _guard_plan(_w(4, 4, 2, 4, 4, pass_start=True))
    (v,) = g.violations
    assert (v.rule, v.error, v.window, v.micro_step) == ("F13", "ShortWindowError", 2, 1)
    assert "after 2 of 4 backward passes in the middle of a pass" in v.message
    g = _guard_plan(_w(1, 1, 1))
    assert [(v.rule, v.window) for v in g.violations][:2] == [("F1", 0), ("F1", 1)]


def test_a_window_spanning_two_passes_is_f7_for_the_guard_before_the_step() -> None:
    """The guard raises at the backward that overruns the window (before any step): F7,
    since a new DataLoader pass began inside it; without the pass, a late boundary (F13)."""
    g = _guard_plan("B" + "bbbs" + "bbbbs" + "bb" + "B" + "bbb")
    v = g.violations[0]
    assert (v.rule, v.window, v.micro_step) == ("F7", 2, 4)
    assert "a new pass over the DataLoader began at backward pass 3" in v.message
    g = _guard_plan("bbbbs" + "bbbbb")
    assert g.violations[0].rule == "F13"


def test_a_finding_every_rank_made_alike_is_one_finding_naming_the_ranks() -> None:
    """Two ranks with the same short first window: one F13 naming both ranks; with a
    different window on each rank, the ranks' own words are kept in the one finding."""
    rows = {r: [s.as_dict(rank=r) for s in _records(_w(1, 4, 4))] for r in (0, 1)}
    found, _, _ = analyze(RunRecording(steps=rows, world=2), k_flag=K)
    assert [f.rank for f in found if f.cls == "F13"] == [0, 1]
    merged = [f for f in merge_ranks(found, [0, 1]) if f.cls == "F13"]
    assert len(merged) == 1 and merged[0].rank is None
    assert merged[0].evidence.startswith("on every rank (0, 1): the first optimizer step")
    rows[1] = [s.as_dict(rank=1) for s in _records(_w(2, 4, 4))]
    found, _, _ = analyze(RunRecording(steps=rows, world=2), k_flag=K)
    merged = [f for f in merge_ranks(found, [0, 1]) if f.cls == "F13"]
    assert len(merged) == 1 and "with different measurements per rank" in merged[0].evidence
    assert "after 1 backward pass" in merged[0].evidence
    assert "after 2 backward pass" in merged[0].evidence
    # found on one rank of two: kept as that rank's
    rows[1] = [s.as_dict(rank=1) for s in _records(_w(4, 4, 4))]
    found, _, _ = analyze(RunRecording(steps=rows, world=2), k_flag=K)
    assert [f.rank for f in merge_ranks(found, [0, 1]) if f.cls == "F13"] == [0]


# -- the same shapes as real torch loops (one process): the observer's side of the facts --

def _data(n: int) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(n, 5, 6, generator=g), torch.randint(0, 3, (n, 5), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=None)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    return m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def _loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, n: int = K) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(m(x), y, reduction="sum") / (5 * n)


Loop = Callable[[torch.nn.Module, torch.optim.Optimizer], None]


def _epochs(step_at: Callable[[int, int], bool], tail: bool) -> Loop:
    """Two epochs of 10 micro-batches; a step where ``step_at(i, epoch)``; ``tail``: step
    on each epoch's leftover, normalised by its own count."""
    def loop(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        dl = _data(10)
        for ep in range(2):
            for i, (x, y) in enumerate(dl):
                _loss(m, x, y, 2 if tail and i >= 8 else K).backward()
                if step_at(i, ep) or (tail and i == 9):
                    opt.step()
                    opt.zero_grad()
        opt.step()  # (the run's last leftover, when not stepped: judged as the run's end)
        opt.zero_grad()
    return loop


def _double_step(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i, (x, y) in enumerate(_data(12)):
        _loss(m, x, y).backward()
        if (i + 1) % K == 0:
            opt.step()
            if i == 3:
                opt.step()  # again, on the same gradient
            opt.zero_grad()


REAL: dict[str, tuple[Loop, str | None]] = {
    "a_early_step_in_a_pass": (_epochs(lambda i, ep: (i + 1) % K == 0 or (ep, i) == (0, 5),
                                       tail=True), "F13"),
    "b_first_step_at_i_0": (_epochs(lambda i, ep: i % K == 0, tail=False), "F13"),
    "c_second_step_on_the_same_gradient": (_double_step, "EXTRA_STEP"),
    "d_leftover_joins_next_epoch": (_epochs(lambda i, ep: (i + 1) % K == 0, tail=False), "F7"),
    "twin_epoch_tail_flushed": (_epochs(lambda i, ep: (i + 1) % K == 0, tail=True), None),
}


def _run_both(loop: Loop, sizes: list[int] | None = None) -> tuple[set[str], set[str]]:
    """The guard's and ``watch``'s error classes on ``loop``; ``sizes``: the windows the
    guard must have closed (its silence is a verdict only on windows it saw)."""
    from accumguard.runtime.guard import guard
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._recording import recording

    m, opt = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = guard(m, opt, accumulation_steps=K, mode="warn")
        with g:
            loop(m, opt)
        m, opt = _model()
        out = Path(tempfile.mkdtemp(prefix="agree-shapes-"))
        with recording(out):
            loop(m, opt)
    found, _, _ = analyze(load_recordings(out), k_flag=K)
    if sizes is not None:
        assert [w.backward_passes for w in g.windows] == sizes
    return {v.rule for v in g.violations}, {f.cls for f in found if f.severity == "error"}


#: what watch also proves beyond the guard's verdict: the off-by-one loop's last leftover (one
#: micro-batch divided by K, stepped by the final ``opt.step()``) is F7 as well; watch records
#: the loss of a pass's last window whatever its time budget, the guard judges the counter
_WATCH_ALSO = {"b_first_step_at_i_0": {"F7"}}


@pytest.mark.parametrize("case", sorted(REAL))
def test_real_loops_guard_and_watch_agree(case: str) -> None:
    loop, expected = REAL[case]
    by_guard, by_watch = _run_both(loop)
    want = set() if expected is None else {expected}
    assert by_guard == want and by_watch == want | _WATCH_ALSO.get(case, set()), (by_guard, by_watch)


# -- correct twins driven by a framework or by more than one optimizer --------------------

def _two_rates(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """A GAN-like pair: the guarded model accumulates K; a second model (a critic with its
    own optimizer) steps after every backward of its own loss."""
    critic = torch.nn.Linear(3, 1)
    copt = torch.optim.SGD(critic.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_data(12)):
        out = m(x)
        (critic(out.detach()).pow(2).mean()).backward()
        copt.step()
        copt.zero_grad()
        (torch.nn.functional.cross_entropy(out, y, reduction="sum") / (5 * K)).backward()
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()


def _scaler_skip(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """GradScaler (CPU) skips the second window's step on an inf gradient."""
    scaler = torch.amp.GradScaler("cpu")
    for i, (x, y) in enumerate(_data(12)):
        scaler.scale(_loss(m, x, y)).backward()
        if (i + 1) % K == 0:
            if i == 7:
                m[0].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()


def _accelerate(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Accelerate's accumulate() over a prepared DataLoader of 10 micro-batches, K = 4, two
    epochs: it steps after micro-batches 4, 8 and at the end of each epoch (10). Its
    backward divides every loss by K, the epoch's tail of 2 included (F7, which ``watch``
    sees in the tokens' weights and the guard, with no loss record, cannot): the loop
    scales the tail's losses by K/2 so that the tail is its own mean."""
    from accelerate import Accelerator

    acc = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model, aopt, dl = acc.prepare(m, opt, _data(10))
    for _ in range(2):
        for i, (x, y) in enumerate(dl):
            with acc.accumulate(model):
                tail = K / 2 if i >= 8 else 1.0
                acc.backward(torch.nn.functional.cross_entropy(model(x), y) * tail)
                aopt.step()
                aopt.zero_grad()


TWINS: dict[str, tuple[Loop, list[int]]] = {
    "two_optimizers_at_two_rates": (_two_rates, [4, 4, 4]),
    "gradscaler_skips_a_step": (_scaler_skip, [4, 4, 4]),
    "accelerate_accumulate_with_epoch_tails": (_accelerate, [4, 4, 2, 4, 4, 2]),
}


@pytest.mark.parametrize("case", sorted(TWINS))
def test_correct_twins_stay_silent_for_both(case: str) -> None:
    if case.startswith("accelerate"):
        pytest.importorskip("accelerate")
    by_guard, by_watch = _run_both(*TWINS[case])
    assert by_guard == by_watch == set(), (by_guard, by_watch)


def test_in_raise_mode_a_step_per_micro_step_stops_the_second_step() -> None:
    """The first step after one backward may be a short first window (F13) or the start of
    a step per micro-step (F1): the guard decides at the second step, before it runs, and
    names the first window."""
    from accumguard.runtime._guard_errors import StepInsideWindowError

    g = GuardMachine(accumulation_steps=K, mode="raise", sync="deferred",
                     total_micro_batches=None, history=8, rank=None)
    g.backward()
    g.step()
    g.zero_grad()
    g.backward()
    with pytest.raises(StepInsideWindowError, match=r"window 0, micro-step 0.*after 1 of 4"):
        g.step()
    assert g.optimizer_steps == 1


def _resumed(restore_gradient: bool) -> Loop:
    """A run resumed from a checkpoint saved after 2 of a window's 4 micro-batches: the
    counter restored (the first step comes after 2 more), and (``restore_gradient``) the
    saved partial window's gradient put back in ``.grad`` before the first backward."""
    def loop(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        batches = list(_data(12))
        if restore_gradient:
            # (in a real resume: loaded from the checkpoint; here, made before the guard
            # or the recording saw anything, as the interrupted run left it)
            for p, g in zip(m.parameters(), _SAVED[0], strict=True):
                p.grad = g.clone()
        for i, (x, y) in enumerate(batches[2:], start=2):
            _loss(m, x, y).backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
    return loop


_SAVED: list[list[torch.Tensor]] = []


@pytest.mark.parametrize(("restore", "expected"), [(True, None), (False, "F13")])
def test_a_resumed_run_continues_its_saved_window_only_with_its_gradient(
        restore: bool, expected: str | None) -> None:
    if not _SAVED:  # the interrupted run's first 2 micro-batches, summed in .grad
        m, _ = _model()
        for x, y in list(_data(12))[:2]:
            _loss(m, x, y).backward()
        _SAVED.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
    by_guard, by_watch = _run_both(_resumed(restore), [2, 4, 4])
    want = set() if expected is None else {expected}
    assert by_guard == by_watch == want, (by_guard, by_watch)


def test_only_the_runs_first_window_continues_a_saved_one() -> None:
    """A short window that began on a gradient later in the run is a leak (F7), for the
    per-window rules of the callbacks too (they judge each window on its own)."""
    from accumguard.observe.rules import live_findings

    late = StepRecord(step=3, backwards=2, conservation=_STALE).as_dict(rank=0)
    assert {f.cls for f in live_findings(late, rank=0, k=K) if f.severity == "error"} == {"F7"}
    first = StepRecord(step=0, backwards=2, conservation=_STALE).as_dict(rank=0)
    assert not [f for f in live_findings(first, rank=0, k=K) if f.severity == "error"]
