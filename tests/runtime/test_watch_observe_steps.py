"""``observe_steps``: watch observes a run's first windows (and its first epoch's end when
that is in reach), then leaves the process with nothing of accumguard in it.

What must hold: the run computes exactly what it computes unobserved (bit-identical
parameters), every patch and hook is gone after the next patched call, the recording ends
with reason ``observed`` at that step, an epoch's tail within reach is still judged, and
the report says which steps the findings are about."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias
from torch.utils.data import DataLoader, TensorDataset

from accumguard.observe import _steps
from accumguard.watch._recording import ENV_OBSERVE_STEPS, observed_env, recording
from accumguard.watch._report import judge

K = 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _list_loop(model: torch.nn.Module, windows: int, t_max: int | None = None) -> None:
    """K micro-batches per window from a generator; with ``t_max``, a cosine schedule
    stepped after every optimizer step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0 if t_max else 0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max) if t_max else None
    g = torch.Generator().manual_seed(1)
    for _ in range(windows):
        for _ in range(K):
            x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
            (F.cross_entropy(model(x), y) / K).backward()
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad()


def _loader_loop(model: torch.nn.Module, batches: int, epochs: int, *, leak: bool) -> None:
    """``batches`` micro-batches per pass; ``leak``: the step counter restarts every
    epoch, so a tail of ``batches % K`` micro-batches is carried into the next epoch's first
    window (F7); otherwise a global counter (windows straddle epochs: correct)."""
    g = torch.Generator().manual_seed(2)
    ds = TensorDataset(torch.randn(batches * 2, 8, generator=g),
                       torch.randint(0, 4, (batches * 2,), generator=g))
    dl = DataLoader(ds, batch_size=2, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    micro = 0
    for _ in range(epochs):
        for i, (x, y) in enumerate(dl):
            (F.cross_entropy(model(x), y) / K).backward()
            micro += 1
            if (i + 1 if leak else micro) % K == 0:
                opt.step()
                opt.zero_grad()


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "rank-0.jsonl").read_text().splitlines()]


def _run(tmp_path: Path, loop: Callable[[torch.nn.Module], None],
         observe: int | None) -> tuple[torch.nn.Module, list[dict[str, object]]]:
    model = _model()
    out = tmp_path / "rec"
    with recording(out, observe_steps=observe):
        loop(model)
    return model, _records(out)


def _end(recs: list[dict[str, object]]) -> dict[str, object]:
    return next(r for r in recs if r["kind"] == "end")


def test_retired_run_is_unchanged_and_only_counters_stay(tmp_path: Path) -> None:
    """After the window that ends observation, the next patched call removes every patch
    and hook of the observer; what stays are the tail's counters (one wrapper of
    ``torch.autograd.backward`` and of ``DataLoader.__iter__``, torch's two global optimizer
    step hooks), gone too when the recording ends. The parameters are bit-identical to an
    unobserved run's."""
    from torch.optim import optimizer as optim_mod

    plain = _model()
    _list_loop(plain, 20)
    originals = {(torch.Tensor, "backward"): torch.Tensor.backward,
                 (F, "cross_entropy"): F.cross_entropy,
                 (torch.optim.Optimizer, "zero_grad"): torch.optim.Optimizer.zero_grad}
    orig_backward = torch.autograd.backward
    model = _model()
    out = tmp_path / "rec"
    seen_after: dict[str, object] = {}
    with recording(out, observe_steps=8) as obs:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        for s in range(20):
            for _ in range(K):
                x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
                (F.cross_entropy(model(x), y) / K).backward()
            opt.step()
            opt.zero_grad()
            if s == 8:  # the window after the one that ended observation
                seen_after = {
                    "patches": all(getattr(owner, name) is fn
                                   for (owner, name), fn in originals.items()),
                    "hooks": (len(optim_mod._global_optimizer_pre_hooks),
                              len(optim_mod._global_optimizer_post_hooks)),
                    "module hooks": any(m._forward_pre_hooks or m._forward_hooks
                                        for m in model.modules()),
                    "counting": obs.tail is not None and torch.autograd.backward is not
                    orig_backward,
                }
        assert obs.failure is None and obs.failsafe.retired
    assert seen_after == {"patches": True, "hooks": (1, 1), "module hooks": False,
                          "counting": True}
    assert torch.autograd.backward is orig_backward
    assert not optim_mod._global_optimizer_pre_hooks
    assert not optim_mod._global_optimizer_post_hooks
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    recs = _records(out)
    steps = [r for r in recs if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(8))
    end = _end(recs)
    assert end["reason"] == "observed" and end["steps"] == 8 and end["pending_backwards"] == 0
    assert recs[-1]["kind"] == "tail" and recs[-1]["steps"] == 12


def test_every_step_when_not_limited(tmp_path: Path) -> None:
    _, recs = _run(tmp_path, lambda m: _list_loop(m, 12), None)
    assert len([r for r in recs if r["kind"] == "step"]) == 12
    assert _end(recs)["reason"] == "exit" and recs[-1]["kind"] == "end"


def test_first_epoch_end_in_reach_is_observed_and_judged(tmp_path: Path) -> None:
    """Passes of 50 micro-batches (12 windows and a tail of 2): observation goes on past
    observe_steps = 4 through the window where the second pass began and the one after it,
    and the tail carried into that window is F7 (its twin, a global counter, is silent)."""
    _, recs = _run(tmp_path / "leak", lambda m: _loader_loop(m, 50, 3, leak=True), 4)
    steps = [r for r in recs if r["kind"] == "step"]
    begun = [r["step"] for r in steps if r["data_pass_starts"]]
    assert begun[:2] == [0, 12] and len(steps) == 14 and _end(recs)["reason"] == "observed"
    result = judge(tmp_path / "leak" / "rec")
    assert {(f.cls, f.severity) for f in result.findings} >= {("F7", "error")}, result.findings
    assert any("observed the first 14 optimizer steps" in p
               for p in result.report["problems"]), result.report["problems"]
    _, recs = _run(tmp_path / "ok", lambda m: _loader_loop(m, 50, 3, leak=False), 4)
    result = judge(tmp_path / "ok" / "rec")
    assert not [f for f in result.findings if f.severity != "note"], result.findings


def test_epoch_end_out_of_reach_ends_observation_at_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first pass predicted (from len(loader)) to end after OBSERVE_MAX steps: observation
    ends at observe_steps already instead of paying for the whole pass."""
    monkeypatch.setattr(_steps, "OBSERVE_MAX", 10)
    _, recs = _run(tmp_path, lambda m: _loader_loop(m, 80, 1, leak=False), 4)
    assert len([r for r in recs if r["kind"] == "step"]) == 4
    assert _end(recs)["reason"] == "observed"


def test_observed_env_and_what_ignores_it(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    env = observed_env({}, tmp_path, observe_steps=64)
    assert env[ENV_OBSERVE_STEPS] == "64"
    assert ENV_OBSERVE_STEPS not in observed_env(env, tmp_path)
    with pytest.raises(ValueError, match="observe_steps"):
        observed_env({}, tmp_path, observe_steps=0)
    from accumguard.watch._recording import _Agent

    monkeypatch.setenv(ENV_OBSERVE_STEPS, "64")
    assert _Agent(tmp_path).observe_steps == 64
    # invariance and advise compare every step they asked for
    monkeypatch.setenv("ACCUMGUARD_RECORD_UPDATES", "1")
    assert _Agent(tmp_path).observe_steps is None


def test_cli_rejects_a_negative_count(capsys: pytest.CaptureFixture[str]) -> None:
    from accumguard.cli.watch import watch_main

    assert watch_main(["--observe-steps", "-1", "--", "python", "x.py"]) == 2
    assert "--observe-steps must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(("t_max", "f4"), [(30 * K, True), (30, False)])
def test_the_horizon_is_judged_on_the_whole_run(tmp_path: Path, t_max: int, f4: bool) -> None:
    """A schedule planned in micro-steps (K x the run's 30 optimizer steps) is F4 although
    watch observed only the first 8 steps: the rest of the run was counted (the ``tail``
    record: steps, backwards, each scheduler's final position), and its counters are gone
    when the recording ends."""
    orig = torch.autograd.backward
    _, recs = _run(tmp_path, lambda m: _list_loop(m, 30, t_max), 8)
    assert torch.autograd.backward is orig
    tail = recs[-1]
    assert tail["kind"] == "tail" and tail["reason"] == "exit"
    assert (tail["steps"], tail["backwards"], tail["pending_backwards"]) == (22, 88, 0)
    (final,) = tail["schedulers"]
    assert final["pos"] == 30 and final["step"] == 30
    result = judge(tmp_path / "rec")
    errors = [f for f in result.findings if f.severity == "error"]
    if f4:
        (f,) = errors
        assert f.cls == "F4" and "30 optimizer steps" in f.evidence, f.evidence
    else:
        assert errors == [], errors


def test_a_new_phase_after_the_observed_steps_is_reported_unobserved(tmp_path: Path) -> None:
    """A second optimizer object (a second stage, a model rebuilt to resume) that starts
    stepping after observation ended is not observed; the report says so, with its count."""
    def two_phases(model: torch.nn.Module) -> None:
        _list_loop(model, 10)
        _list_loop(model, 5)  # a new SGD object: the second phase

    _, recs = _run(tmp_path, two_phases, 6)
    tail = recs[-1]
    assert tail["kind"] == "tail" and (tail["steps"], tail["new_optimizer_steps"]) == (9, 5)
    lines = judge(tmp_path / "rec").report["problems"]
    assert any("made 5 optimizer step(s)" in p and "none of them was observed" in p
               for p in lines), lines


def test_counters_that_cannot_be_installed_change_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tail's install raising (a fault injected where the observer retires, inside the
    user's zero_grad): the run goes on bit-identical, nothing is left installed, the tail
    record says the rest is unknown, and the horizon rule judges the observed steps as a run
    cut there (no F4 claimed from counts that do not exist)."""
    from accumguard.observe import _tail

    plain = _model()
    _list_loop(plain, 30, 30 * K)

    def boom(self: object) -> object:
        raise RuntimeError("injected fault in the tail's install")

    monkeypatch.setattr(_tail.Tail, "install", boom)
    orig = torch.autograd.backward
    model, recs = _run(tmp_path, lambda m: _list_loop(m, 30, 30 * K), 8)
    assert torch.autograd.backward is orig
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert recs[-1] == {"kind": "tail", "reason": "exit", "unknown": True}
    errors = [f for f in judge(tmp_path / "rec").findings if f.severity == "error"]
    assert errors == [], errors


def test_a_fault_in_the_counters_scheduler_read_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tail reads each LR scheduler's state inside the user's ``scheduler.step()``; that
    read raising (injected after observation ended) costs the scheduler's final state only:
    the step runs, the run stays bit-identical, its stale state is not reported as final,
    and a right schedule gets no finding."""
    from accumguard.observe import _schedules

    plain = _model()
    _list_loop(plain, 20, 20)
    model = _model()
    out = tmp_path / "rec"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    g = torch.Generator().manual_seed(1)
    real, armed = _schedules.schedule_state, [False]

    def read(sched: object) -> dict[str, object]:
        if armed[0]:
            raise RuntimeError("injected fault in schedule_state")
        return real(sched)

    monkeypatch.setattr(_schedules, "schedule_state", read)
    with recording(out, observe_steps=8) as obs:
        for s in range(20):
            armed[0] = s >= 8  # observation has ended: the fault hits the counters only
            for _ in range(K):
                x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
                (F.cross_entropy(model(x), y) / K).backward()
            opt.step()
            sched.step()
            opt.zero_grad()
        assert obs.failure is None and obs.tail is not None
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    tail = _records(out)[-1]
    assert tail["kind"] == "tail" and tail["steps"] == 12 and tail["schedulers"] == []
    assert [f for f in judge(out).findings if f.severity == "error"] == []
