"""The fail-safe doors: an internal error of accumguard never reaches the user's code nor
changes what it computes; it switches observation off and is recorded as accumguard's own.

In-process: every door kind of the observer (patches and hooks, before and after the
wrapped call) is made to fail once on a small but complete loop (DataLoader, autocast-free
cross-entropy, clipping, GradScaler-free AdamW, scheduler, zero_grad); the parameters must
be bit-identical to the unobserved run, the failure recorded with its traceback, and the
patches gone. The same on real engines and frameworks: tests/runtime/test_failsafe_stacks.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.core.errors import AccumulationError
from accumguard.observe._failsafe import ENV_FAULT, Failsafe, InjectedFault
from accumguard.observe._patch import Patches
from accumguard.observe.rules import load_recordings
from accumguard.watch._recording import recording

from helpers import free_port

K, STEPS = 3, 4


def _train() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g))
            for _ in range(K * STEPS)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / K
        loss.backward()
        if (i + 1) % K == 0:
            torch.nn.utils.clip_grad_norm_((p for p in model.parameters()), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
    # a resume's state load (its own door): the same state back, nothing changes
    opt.load_state_dict(opt.state_dict())
    # a gradient made by torch.autograd.grad (its own door), unused by the update
    x, y = data[0]
    torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    return [p.detach().clone() for p in model.parameters()]


#: (label, when, nth): every door the loop above goes through, failing before and after
#: the wrapped call, at its first call and later in the run.
FAULTS = [
    ("Tensor.backward", "pre", 1), ("Tensor.backward", "post", 5),
    ("Optimizer.zero_grad", "pre", 2), ("Optimizer.zero_grad", "post", 1),
    ("DataLoader.__iter__", "pre", 1), ("DataLoader.__iter__", "post", 1),
    ("LRScheduler.step", "pre", 2), ("LRScheduler.step", "post", 1),
    ("clip_grad_norm_", "pre", 2), ("clip_grad_norm_", "post", 1),
    ("cross_entropy", "pre", 4), ("cross_entropy", "post", 4),
    ("autograd.grad", "pre", 1), ("autograd.grad", "post", 1),
    ("hook:_opt_pre", "pre", 2), ("hook:_opt_post", "pre", 3),
    ("hook:_global_pre", "pre", 7), ("hook:_depth_post", "pre", 2),
    ("hook:_on_grad", "pre", 3),
    # the optimizer's construction: its birth record (a run rebuilt to resume) after the call
    ("Optimizer.__init__", "post", 1),
    # a resume's optimizer state load (the step it ran before is recorded after the call)
    ("Optimizer.load_state_dict", "pre", 1), ("Optimizer.load_state_dict", "post", 1),
]


@pytest.fixture(scope="module")
def unobserved() -> list[torch.Tensor]:
    return _train()


@pytest.mark.parametrize(("label", "when", "nth"), FAULTS)
def test_an_internal_error_changes_nothing_and_is_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unobserved: list[torch.Tensor],
        label: str, when: str, nth: int) -> None:
    original_backward = torch.Tensor.backward
    monkeypatch.setenv(ENV_FAULT, f"{label}:{when}@{nth}")
    with recording(tmp_path) as obs:
        params = _train()
        failure = obs.failure
        assert failure is not None, "the injected fault did not fire"
        assert failure.where.endswith(label) or label in failure.where
        assert "InjectedFault" in failure.error and "Traceback" in failure.traceback
        # observation is off: the patches were undone at the first safe point
        assert torch.Tensor.backward is original_backward
    for a, b in zip(params, unobserved, strict=True):
        assert torch.equal(a, b), f"{label}:{when}@{nth} changed the training"
    rec = load_recordings(tmp_path)
    assert list(rec.failures) == [0]
    assert rec.failures[0]["where"] == failure.where
    # only windows every rank completed before the failure are judged
    assert rec.observed_steps == failure.step
    assert all(int(s["step"]) < failure.step for s in rec.steps.get(0, []))


def test_the_users_own_error_passes_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception raised by the wrapped call reaches the user as it is, even when the
    wrapper's own work after it fails too (it is not chained to accumguard's error)."""
    monkeypatch.setenv(ENV_FAULT, "Thing.run:post@1")
    fs = Failsafe()

    class Thing:
        def run(self, x: int) -> int:
            raise KeyError(x)

    def make(orig):  # noqa: ANN001, ANN202
        def run(this, x):  # noqa: ANN001, ANN202
            try:
                return orig(this, x)
            finally:
                raise ValueError("accumguard's own bug while unwinding")

        return run

    Patches(fs).wrap(Thing, "run", make)
    with pytest.raises(KeyError) as info:
        Thing().run(7)
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert fs.failure is not None and "ValueError" in fs.failure.error


def _counting_thing(calls: list[int]) -> type:
    """A class whose ``run(x)`` appends ``x`` to ``calls`` and returns ``2 * x``: the user's
    function a patch wraps."""

    class Thing:
        def run(self, x: int) -> int:
            calls.append(x)
            return x * 2

    return Thing


def test_the_wrapped_call_runs_once_whatever_fails() -> None:
    fs = Failsafe()
    calls: list[int] = []

    Thing = _counting_thing(calls)

    def make(orig):  # noqa: ANN001, ANN202
        def run(this, x):  # noqa: ANN001, ANN202
            orig(this, x)
            raise RuntimeError("bookkeeping after the call failed")

        return run

    Patches(fs).wrap(Thing, "run", make)
    assert Thing().run(3) == 6  # the result of the one real call
    assert calls == [3]
    assert Thing().run(4) == 8 and calls == [3, 4]  # off: a plain pass-through
    assert fs.failure is not None and fs.failure.where == "Thing.run"


def test_a_wrapper_that_passes_skips_itself_and_a_failing_test_of_it_changes_nothing() -> None:
    """A wrapper's ``passes`` (the door's short cut: its own first test, read before the
    door's bookkeeping) sends the call straight to the original while it holds; when that
    test itself fails, the original still runs once and the failure is accumguard's."""
    fs = Failsafe()
    calls: list[int] = []
    wrapped: list[int] = []
    state = {"through": False, "broken": False}

    Thing = _counting_thing(calls)

    def make(orig):  # noqa: ANN001, ANN202
        def run(this, x):  # noqa: ANN001, ANN202
            wrapped.append(x)
            return orig(this, x)

        def passes() -> bool:
            if state["broken"]:
                raise RuntimeError("the short cut's test failed")
            return state["through"]

        run.passes = passes
        return run

    Patches(fs).wrap(Thing, "run", make)
    assert Thing().run(1) == 2 and wrapped == [1]
    state["through"] = True
    assert Thing().run(2) == 4 and wrapped == [1]  # straight to the original
    state["through"], state["broken"] = False, True
    assert Thing().run(3) == 6 and calls == [1, 2, 3]  # ran once, unchanged
    assert fs.failure is not None and "short cut" in fs.failure.error
    state["broken"] = False
    assert Thing().run(4) == 8 and wrapped == [1]  # off from then on: a plain pass-through


def test_a_consumed_generator_is_handed_back_for_the_pass_through() -> None:
    fs = Failsafe()

    def total(xs):  # noqa: ANN001, ANN202
        return sum(xs)

    holder = type("Holder", (), {"total": total})

    def make(orig):  # noqa: ANN001, ANN202
        def wrapped(xs):  # noqa: ANN001, ANN202
            xs = list(xs)
            fs.set_args(xs)
            raise RuntimeError("failed after reading the generator")

        return wrapped

    Patches(fs).wrap(holder, "total", make)
    assert holder.total(i for i in range(5)) == 10


def test_the_guards_deliberate_error_still_stops_the_action() -> None:
    fs = Failsafe()

    class Thing:
        def run(self) -> str:
            return "ran"

    def make(orig):  # noqa: ANN001, ANN202
        def run(this):  # noqa: ANN001, ANN202
            raise AccumulationError("zero_grad inside the window")

        return run

    Patches(fs).wrap(Thing, "run", make)
    with pytest.raises(AccumulationError):
        Thing().run()
    assert fs.ok and fs.failure is None


def test_a_failing_hook_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fs = Failsafe()

    def bad(module, args, output):  # noqa: ANN001, ANN202
        raise IndexError("internal")

    lin = torch.nn.Linear(2, 2)
    x = torch.randn(3, 2)
    want = lin(x)
    handle = lin.register_forward_hook(fs.hook(bad, "bad"))
    assert torch.equal(lin(x), want)
    assert fs.failure is not None and fs.failure.where == "hook:bad"
    handle.remove()


def test_injected_fault_is_a_runtime_error() -> None:
    assert issubclass(InjectedFault, RuntimeError)


def test_compiled_module_gets_no_warning_about_accumguards_hook(tmp_path: Path) -> None:
    """torch.compile(module) warns on every call while a global module hook exists; until
    the roots are pinned the only one is accumguard's, so the script's stderr would change
    under watch (blind round 11). Left out while ours is the only global hook."""
    import warnings

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    cm = torch.compile(m, backend="aot_eager")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught, recording(tmp_path) as obs:
        warnings.simplefilter("always")
        for i in range(4):
            cm(torch.randn(3, 4)).sum().backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
        assert obs.failure is None
    assert not [w for w in caught if "global hooks" in str(w.message)], \
        [str(w.message) for w in caught]


def test_torchs_scheduler_warning_points_at_the_script_not_at_accumguard(
        tmp_path: Path) -> None:
    """torch warns with stacklevel=2 (the caller of scheduler.step()); inside the wrappers
    that was accumguard's own frame, so the script's stderr named _failsafe.py (blind
    round 12). The warning is re-issued at the script's line."""
    import warnings

    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    with warnings.catch_warnings(record=True) as caught, recording(tmp_path):
        warnings.simplefilter("always")
        m(torch.randn(3, 2)).sum().backward()
        sched.step()  # before opt.step(): torch warns here
        opt.step()
    hits = [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    assert hits and all(w.filename == __file__ for w in hits), [(w.filename, w.lineno)
                                                                 for w in hits]


def _train_ddp() -> list[torch.Tensor]:
    """A 1-rank gloo DDP loop with a hand-written all-reduce: both doors of the collective
    ledger (DDP's bucket booking at a synced backward, a Python collective's booking)."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for i in range(K * 2):
        x = torch.randn(5, 6, generator=g)
        with model.no_sync() if (i + 1) % K else contextlib.nullcontext():
            (model(x).pow(2).mean() / K).backward()
        if (i + 1) % K == 0:
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)  # world 1: unchanged
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("label", ["hook:_ledger_ddp", "hook:_ledger_collective"])
def test_a_ledger_fault_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        label: str) -> None:
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        unobserved = _train_ddp()
        monkeypatch.setenv(ENV_FAULT, f"{label}:pre@1")
        with recording(tmp_path) as obs:
            params = _train_ddp()
            assert obs.failure is not None and obs.failure.where == label
    finally:
        dist.destroy_process_group()
    for a, b in zip(params, unobserved, strict=True):
        assert torch.equal(a, b), f"{label} changed the training"
    assert list(load_recordings(tmp_path).failures) == [0]


def test_a_fault_reading_a_schedule_horizon_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unobserved: list[torch.Tensor]) -> None:
    """The schedule-horizon reading (new code run at every scheduler step under watch) sits
    behind the scheduler's patch door: its failure switches observation off, not the run."""
    import accumguard.observe._schedules as schedules

    def broken(owner: object) -> dict[str, object]:
        raise RuntimeError("injected: schedule_state")

    monkeypatch.setattr(schedules, "schedule_state", broken)
    with recording(tmp_path) as obs:
        params = _train()
        failure = obs.failure
    assert failure is not None and "schedule_state" in failure.error + failure.traceback
    for a, b in zip(params, unobserved, strict=True):
        assert torch.equal(a, b)


def _train_selection() -> list[torch.Tensor]:
    """A policy-gradient loop (log_softmax + gather, a term added to the loss): the per-term
    and selection records' hook runs at every backward."""
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(9, 8), torch.nn.Linear(8, 9)
    params = [*emb.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        for _ in range(K):
            seq = torch.randint(0, 9, (3, 6), generator=g)
            lp = F.log_softmax(head(emb(seq[:, :-1])), -1)
            logp = lp.gather(-1, seq[:, 1:, None]).squeeze(-1)
            loss = -(torch.randn(3, 1, generator=g) * logp).sum() / (15 * K)
            (loss + 0.01 * lp.exp().mean()).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize(("label", "nth"), [("hook:_on_select", 1), ("hook:_on_select", 5),
                                            ("autograd.backward", 3)])
def test_a_fault_recording_a_selection_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str, nth: int) -> None:
    unobserved = _train_selection()
    monkeypatch.setenv(ENV_FAULT, f"{label}:pre@{nth}")
    with recording(tmp_path) as obs:
        params = _train_selection()
        assert obs.failure is not None and label in obs.failure.where
    for a, b in zip(params, unobserved, strict=True):
        assert torch.equal(a, b), f"{label} changed the training"
    assert list(load_recordings(tmp_path).failures) == [0]


@pytest.mark.parametrize("where", ["at_backward", "take", "know"])
def test_a_fault_tracing_the_learning_rate_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unobserved: list[torch.Tensor],
        where: str) -> None:
    """The learning-rate trace (read at every backward, taken at every step, an optimizer
    known from its construction under observation) runs inside the backward's, the step's
    and the optimizer constructor's doors: its failure switches observation off, not the
    run."""
    from accumguard.observe._lr_trace import LrTrace

    def broken(self: LrTrace, *a: object) -> None:
        raise RuntimeError(f"injected: lr {where}")

    monkeypatch.setattr(LrTrace, where, broken)
    with recording(tmp_path) as obs:
        params = _train()
        failure = obs.failure
    assert failure is not None and f"lr {where}" in failure.error + failure.traceback
    for a, b in zip(params, unobserved, strict=True):
        assert torch.equal(a, b)


def test_a_fault_reading_fsdp2_unit_factors_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unobserved: list[torch.Tensor]) -> None:
    """The per-unit reduction factors (read at a step with a loss record when the engine's
    one factor is unknown) run inside the step's door: their failure switches observation
    off, not the run."""
    import accumguard.observe._steps as steps

    def broken(engine: str, groups: object) -> None:
        raise RuntimeError("injected: unit_factors")

    monkeypatch.setattr(steps, "unit_factors", broken)
    with recording(tmp_path) as obs:
        params = _train()
        failure = obs.failure
    assert failure is not None and "unit_factors" in failure.error + failure.traceback
    for a, b in zip(params, unobserved, strict=True):
        assert torch.equal(a, b)


def _train_bf16() -> list[torch.Tensor]:
    """A bf16 model summing K micro-gradients in its own .grad: the drift hook's door
    (:class:`accumguard.observe._precision.AccumDrift`) is on its parameters."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(),
                                torch.nn.Linear(12, 3)).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        for _ in range(K):
            x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            (F.cross_entropy(model(x.bfloat16()).float(), y) / K).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("nth", [1, 7])
def test_a_fault_in_the_drift_hook_changes_nothing(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    nth: int) -> None:
    unobserved = _train_bf16()
    monkeypatch.setenv(ENV_FAULT, f"hook:precision_drift:pre@{nth}")
    with recording(tmp_path) as obs:
        params = _train_bf16()
        failure = obs.failure
        assert failure is not None and "precision_drift" in failure.where
    for a, b in zip(params, unobserved, strict=True):
        assert torch.equal(a, b)
    assert list(load_recordings(tmp_path).failures) == [0]


#: module-level settings a schedule function reads (the horizon ``_global_horizons`` reads)
_SCHED = {"total_steps": 8}


def _decay(step: int) -> float:
    return max(0.0, 1 - step / _SCHED["total_steps"])


def _train_weighted() -> list[torch.Tensor]:
    """A mean of per-sample losses times per-sample weights (the walk's weighted-mean path)
    under a module-level LambdaLR function (the module-global horizon read)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _decay)
    g = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        for _ in range(K):
            x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
            w = 1.0 + y.abs().sum(1)
            ((F.mse_loss(model(x), y, reduction="none").mean(1) * w).mean() / K).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("where", ["_global_horizons", "on_walk"])
def test_a_fault_in_this_sessions_readers_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The horizon read from a schedule function's module (at every scheduler step) and the
    "mean" record of a weighted hand-built mean (``TermLog.on_walk``, at every backward) fail
    inside their doors:
    observation switches off, the failure is accumguard's, the weights are bit-equal."""
    import accumguard.observe._losses_terms as terms
    import accumguard.observe._schedules as schedules

    plain = _train_weighted()
    module: object = schedules if where == "_global_horizons" else terms.TermLog

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError(f"injected: {where}")

    monkeypatch.setattr(module, where, broken)
    with recording(tmp_path) as obs:
        params = _train_weighted()
        failure = obs.failure
    assert failure is not None and where in failure.error + failure.traceback
    for a, b in zip(params, plain, strict=True):
        assert torch.equal(a, b)


def _train_rebuilt() -> list[torch.Tensor]:
    """Two optimizers over disjoint parameters, a step with a closure, then a rebuilt model
    and optimizers (a resume) whose first window starts on a restored gradient: the paths of
    the lanes' re-cut after a closure and of their "began on a gradient" read."""
    g = torch.Generator().manual_seed(3)

    def build() -> tuple[torch.nn.Module, torch.nn.Module, list[torch.optim.Optimizer]]:
        torch.manual_seed(0)
        a, b = torch.nn.Linear(5, 4), torch.nn.Linear(4, 2)
        return a, b, [torch.optim.SGD(a.parameters(), lr=0.1),
                      torch.optim.Adam(b.parameters(), lr=1e-2)]

    def micro(a: torch.nn.Module, b: torch.nn.Module) -> torch.Tensor:
        loss = b(a(torch.randn(4, 5, generator=g))).pow(2).mean() / K
        loss.backward()
        return loss

    a, b, opts = build()
    for _ in range(2):
        for _ in range(K - 1):
            micro(a, b)
        opts[0].step(lambda: micro(a, b))  # the window's last micro-step in the closure
        opts[1].step()
        for o in opts:
            o.zero_grad()
    micro(a, b)
    saved = [p.grad.clone() for p in (*a.parameters(), *b.parameters())]
    a, b, opts = build()
    for p, s in zip((*a.parameters(), *b.parameters()), saved, strict=True):
        p.grad = s.clone()
    for _ in range(2):
        for _ in range(K - 1):
            micro(a, b)
        for o in opts:
            o.step()
            o.zero_grad()
    return [p.detach().clone() for p in (*a.parameters(), *b.parameters())]


@pytest.mark.parametrize("where", ["grad_versions", "_unstepped_after_step", "window"])
def test_a_fault_in_the_gradient_marks_and_the_lanes_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """This session's code in users' processes: the gradient version marks (read at every
    checked backward and step), the lanes' read of a gradient already there (a resumed
    optimizer's first window) and the own window cut again after a closure fail inside
    their doors: observation switches off, the failure is accumguard's, the weights are
    bit-equal."""
    import accumguard.observe._backward as backward
    import accumguard.observe._steps as steps
    from accumguard.observe._lanes import Lanes

    plain = _train_rebuilt()

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError(f"injected: {where}")

    if where == "grad_versions":
        monkeypatch.setattr(backward, "grad_versions", broken)
        monkeypatch.setattr(steps, "grad_versions", broken)
    else:
        monkeypatch.setattr(Lanes, where, broken)
    with recording(tmp_path) as obs:
        params = _train_rebuilt()
        failure = obs.failure
    assert failure is not None and where in failure.error + failure.traceback
    for x, y in zip(params, plain, strict=True):
        assert torch.equal(x, y)
