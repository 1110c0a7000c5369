"""Blind round 106, recorded on 2 gloo ranks (and the PPO mechanism in one process): a PPO
trainer whose actor accumulates K = 4 minibatches while a helper steps the critic's own optimizer after every minibatch
(``train_on``), on a value loss built by hand (a clipped squared error ``.mean()``, no loss
call) divided by K. The critic's backwards are some of the window's, cut off by its own
steps: the loss record is read per backward and the constants above the critic's loss
are given to its window (``lane_scales``). A loss divided by K stepped on one micro-batch
at a time is F1; the twin, whose critic accumulates with the actor, is silent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accumguard.observe import _steps
from accumguard.observe._groups import _slash_k
from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording
from tests.helpers import judge_recorded


def test_a_critic_stepping_each_minibatch_on_a_loss_divided_by_k_is_f1() -> None:
    errors = [f for f in judge_recorded("r106_critic_steps_each_minibatch_loss_over_k", k=4)
              if f.severity == "error"]
    assert {f.cls for f in errors} == {"F1"}, errors
    assert "divided by K = 4" in errors[0].evidence and "optimizer #2" in errors[0].evidence


def test_the_critic_accumulating_with_the_actor_is_silent() -> None:
    found = judge_recorded("r106_critic_accumulates_with_actor", k=4)
    assert [f for f in found if f.severity != "note"] == [], found


def test_only_an_explicit_division_by_k_counts() -> None:
    # a value coefficient (0.5 * mse) is no division by K = 2; nor is a loss divided twice
    assert _slash_k([["/", 4.0], ["*", 0.25]], 4)
    assert not _slash_k([["*", 0.5]], 2)
    assert not _slash_k([["/", 4.0], ["/", 2.0]], 4)
    assert not _slash_k([["/", 3.0]], 4)


# -- the same mechanism in one process, against the large batch ------------------------------

K, STEPS, LR = 4, 3, 0.1


def _nets() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    return torch.nn.Linear(5, 1), torch.nn.Linear(5, 1)


def _batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(3)
    return [[(torch.randn(6, 5, generator=g), torch.randn(6, 1, generator=g)) for _ in range(K)]
            for _ in range(STEPS)]


def _value_loss(critic: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    v = critic(x)
    clipped = y + (v - y).clamp(-0.2, 0.2)
    return 0.5 * torch.max((v - y) ** 2, (clipped - y) ** 2).mean()  # no loss call: by hand


def _loop(critic_steps_each: bool) -> list[torch.Tensor]:
    """The actor accumulates K micro-batches (SGD); the critic's loss is divided by K too, and
    its optimizer (Adam, as PPO's) steps after each micro-batch (the bug: K Adam steps of
    about the learning rate each, where the large batch takes one) or with the actor's."""
    actor, critic = _nets()
    opt_a = torch.optim.SGD(actor.parameters(), lr=LR)
    opt_c = torch.optim.Adam(critic.parameters(), lr=0.01)
    for window in _batches():
        for x, y in window:
            (((actor(x) - y) ** 2).mean() / K).backward()
            (_value_loss(critic, x, y) / K).backward()
            if critic_steps_each:
                opt_c.step()
                opt_c.zero_grad()
        opt_a.step()
        opt_a.zero_grad()
        if not critic_steps_each:
            opt_c.step()
            opt_c.zero_grad()
    return [p.detach().clone() for p in (*actor.parameters(), *critic.parameters())]


def _reference() -> list[torch.Tensor]:
    """One process, one step per window on the full effective batch for both."""
    actor, critic = _nets()
    opt_a = torch.optim.SGD(actor.parameters(), lr=LR)
    opt_c = torch.optim.Adam(critic.parameters(), lr=0.01)
    for window in _batches():
        x = torch.cat([b[0] for b in window])
        y = torch.cat([b[1] for b in window])
        ((actor(x) - y) ** 2).mean().backward()
        # the clipped value loss is a mean over rows: the window's is the mean of its means
        sum(_value_loss(critic, bx, by) for bx, by in window).div(K).backward()
        for opt in (opt_a, opt_c):
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in (*actor.parameters(), *critic.parameters())]


def _critic_update_error(params: list[torch.Tensor]) -> float:
    start = [p.detach() for p in _nets()[1].parameters()]
    ref = _reference()[2:]
    got = params[2:]
    num = sum(float(((a - s) - (r - s)).norm() ** 2) for a, r, s in zip(got, ref, start, strict=True))
    den = sum(float((r - s).norm() ** 2) for r, s in zip(ref, start, strict=True))
    return (num / den) ** 0.5


def _observed(tmp_path: Path, each: bool) -> list[Finding]:
    plain = _loop(each)
    with recording(tmp_path):
        seen = _loop(each)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return findings


def test_in_one_process_the_critic_stepping_each_micro_batch_is_f1_and_off(tmp_path: Path) -> None:
    findings = _observed(tmp_path, each=True)
    assert [f.cls for f in findings if f.severity == "error"] == ["F1"], findings
    assert _critic_update_error(_loop(True)) > 0.05


def test_in_one_process_the_critic_stepping_per_window_is_silent_and_exact(tmp_path: Path) -> None:
    findings = _observed(tmp_path, each=False)
    assert [f for f in findings if f.severity == "error"] == [], findings
    assert _critic_update_error(_loop(False)) < 1e-5


def test_a_fault_reading_the_lanes_losses_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _loop(True)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected into lane_scales")

    monkeypatch.setattr(_steps, "lane_scales", broken)
    with recording(tmp_path) as obs:
        params = _loop(True)
        failure = obs.failure
    assert failure is not None and "injected into lane_scales" in failure.error
    assert all(torch.equal(a, b) for a, b in zip(params, plain, strict=True))


def test_two_deepspeed_engines_recorded_each_on_its_own_window() -> None:
    """Blind round 106 b_b01 (recorded with the engines' own windows): an actor and a critic
    engine, ZeRO-0, GA 2, each engine.backward + engine.step per micro-batch: silent; the
    critic's config built with GA 1 (an inference config helper): F1."""
    ok = judge_recorded("r106_two_deepspeed_engines_own_windows")
    assert [f for f in ok if f.severity == "error"] == [], ok
    bad = [f for f in judge_recorded("r106_ds_critic_engine_ga1") if f.severity == "error"]
    assert {f.cls for f in bad} == {"F1"}, bad
