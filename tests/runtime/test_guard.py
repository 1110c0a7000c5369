"""The runtime guard in one process: each rule fires on its broken loop with a message that
names the rule, the window and micro-step, what was seen and the fix; correct loops (hand
written and the Accumulator, with clipping, GradScaler, scheduler, short final window)
pass; everything the guard installed is removed and the previous objects come back."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from accumguard import AccumguardWarning, AccumulationError, Accumulator
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss
from accumguard.runtime.guard import (
    AccumulationGuard,
    ClipInsideWindowError,
    ExtraStepError,
    GradientLeakError,
    GuardViolation,
    Phase,
    SchedulerStepError,
    StepInsideWindowError,
    WindowOverrunError,
    ZeroGradInsideWindowError,
    guard,
)

K = 4


def _setup(micro_batches: int = 8) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, list]:
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    data = make_rank_batches(seed=0, world_size=1, micro_batches=micro_batches)[0]
    return model, opt, sched, data


def _loop(model: Any, opt: Any, sched: Any, data: list, bug: str | None = None,
          scaler: Any = None) -> None:
    """A hand-written accumulation loop; ``bug`` injects one known mistake."""
    k = K + 1 if bug == "off_by_one" else K
    for i, batch in enumerate(data):
        last = (i + 1) % k == 0 or i + 1 == len(data)
        s, _ = token_loss(model, batch)
        loss = s / 100
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if bug == "clip_every_micro_step":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if bug == "zero_grad_inside_window":
            model.zero_grad()
        if bug == "grad_none_inside_window":
            for p in model.parameters():
                p.grad = None
        if bug == "scheduler_every_micro_step":
            sched.step()
        if bug == "step_every_micro_step" or last:
            if scaler is not None and bug != "clip_before_unscale":
                scaler.unscale_(opt)
            if last and bug != "clip_every_micro_step":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if bug == "double_step":
                opt.step()
            if bug != "scheduler_every_micro_step":
                sched.step()
            if bug == "double_scheduler_step":
                sched.step()
            if bug != "no_zero_grad":
                opt.zero_grad()


def test_correct_loop_passes_and_counts() -> None:
    model, opt, sched, data = _setup(10)  # windows of 4, 4 and a short final 2
    with guard(model, opt, accumulation_steps=K, scheduler=sched, total_micro_batches=10) as g:
        _loop(model, opt, sched, data)
    assert g.violations == []
    assert [w.backward_passes for w in g.windows] == [4, 4, 2]
    assert g.summary() == {"windows": 3, "backward_passes": 10, "optimizer_steps": 3,
                           "skipped_steps": 0, "scheduler_steps": 3, "sync_rounds": 0,
                           "violations": 0}


@pytest.mark.parametrize(("bug", "error", "where", "seen"), [
    ("step_every_micro_step", StepInsideWindowError, "window 0, micro-step 0",
     "optimizer.step() after 1 of 4 backward passes"),
    ("double_step", ExtraStepError, "window 0, micro-step 3", "a second optimizer.step()"),
    ("zero_grad_inside_window", ZeroGradInsideWindowError, "window 0, micro-step 0",
     "zero_grad() after 1 of 4 backward passes"),
    ("grad_none_inside_window", ZeroGradInsideWindowError, "window 0, micro-step 1",
     "gradients were cleared (set to None) before backward pass 2"),
    # the first scheduler step may precede the optimizer step (a one-step shift, not F4);
    # the second one in the window is the error
    ("scheduler_every_micro_step", SchedulerStepError, "window 0, micro-step 1",
     "scheduler.step() after 2 of 4 backward passes: 2 scheduler steps for 0 optimizer"),
    ("double_scheduler_step", SchedulerStepError, "window 0, micro-step 3",
     "a second scheduler.step()"),
    ("no_zero_grad", GradientLeakError, "window 0",
     "gradients still set when the next window started"),
    ("clip_every_micro_step", ClipInsideWindowError, "window 0, micro-step 0",
     "clip_grad_norm_() after 1 of 4 backward passes"),
    ("off_by_one", WindowOverrunError, "window 0, micro-step 4",
     "backward pass 5 in a window of 4"),
])
def test_each_broken_loop_raises_its_rule(bug: str, error: type[GuardViolation], where: str,
                                          seen: str) -> None:
    model, opt, sched, data = _setup()
    with pytest.raises(error) as info, guard(model, opt, accumulation_steps=K, scheduler=sched):
        _loop(model, opt, sched, data, bug)
    e = info.value
    assert isinstance(e, AccumulationError)
    msg = str(e)
    assert msg.startswith(f"[{error.rule} ")
    assert where in msg and seen in msg and "expected" in msg and "Fix:" in msg
    assert e.window == 0


def test_short_final_window_is_right_declared_or_not() -> None:
    model, opt, sched, data = _setup(10)
    # undeclared, the short window's step is judged once the run ended after it: the run's
    # final partial window (its scale is watch's to judge, from the loss record)
    with guard(model, opt, accumulation_steps=K, scheduler=sched) as g:
        _loop(model, opt, sched, data)
    assert g.violations == [] and [w.backward_passes for w in g.windows] == [4, 4, 2]
    # ... or with expect_window right before it
    model, opt, sched, data = _setup(10)
    with guard(model, opt, accumulation_steps=K, scheduler=sched) as g:
        _loop(model, opt, sched, data[:8])
        g.expect_window(2)
        _loop(model, opt, sched, data[8:])
    assert [w.backward_passes for w in g.windows] == [4, 4, 2]


def test_unfinished_window_is_reported_on_exit() -> None:
    model, opt, sched, data = _setup()
    with pytest.raises(GradientLeakError, match="closed with 2 of 4 backward passes"), \
            guard(model, opt, accumulation_steps=K, scheduler=sched):
        _loop(model, opt, sched, data[:4])
        for batch in data[4:6]:  # the loop stops in the middle of window 1
            token_loss(model, batch)[0].backward()


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before")
def test_gradscaler_clip_before_unscale_and_skipped_steps() -> None:
    model, opt, sched, data = _setup()
    scaler = torch.amp.GradScaler("cpu")
    with guard(model, opt, accumulation_steps=K, scheduler=sched, scaler=scaler) as g:
        _loop(model, opt, sched, data, scaler=scaler)
    assert g.violations == []
    model, opt, sched, data = _setup()
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(ClipInsideWindowError, match="before scaler.unscale_"), \
            guard(model, opt, accumulation_steps=K, scheduler=sched, scaler=scaler):
        _loop(model, opt, sched, data, "clip_before_unscale", scaler=scaler)
    # an inf gradient makes GradScaler skip optimizer.step: the window still ended
    model, opt, sched, data = _setup()
    scaler = torch.amp.GradScaler("cpu")
    with guard(model, opt, accumulation_steps=K, scheduler=sched, scaler=scaler) as g:
        for start in (0, 4):
            for batch in data[start:start + K]:
                scaler.scale(token_loss(model, batch)[0]).backward()
            if start == 0:
                model.fc1.weight.grad[0, 0] = float("inf")
            scaler.step(opt)  # skips optimizer.step() in window 0
            scaler.update()
            sched.step()
            opt.zero_grad()
    assert (g.skipped_steps, g.optimizer_steps, g.violations) == (1, 1, [])


def test_accumulator_never_trips_the_guard() -> None:
    model, opt, sched, data = _setup(10)
    scaler = torch.amp.GradScaler("cpu")
    acc = Accumulator(model, opt, accumulation_steps=K, scheduler=sched, scaler=scaler,
                      max_grad_norm=0.5, count_fn=count_tokens)
    with guard(model, opt, accumulation_steps=K, scheduler=sched, scaler=scaler,
               total_micro_batches=10) as g:
        for window in acc.windows(data):
            window.run(lambda b: token_loss(model, b)[0])
    assert g.violations == [] and g.optimizer_steps == 3


def test_warn_mode_warns_once_per_rule_and_keeps_going() -> None:
    model, opt, sched, data = _setup(12)
    g = guard(model, opt, accumulation_steps=K, scheduler=sched, mode="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with g:
            _loop(model, opt, sched, data, "scheduler_every_micro_step")
    ours = [w for w in caught if issubclass(w.category, AccumguardWarning)]
    assert len(ours) == 1 and "[F4 " in str(ours[0].message)
    assert len(g.violations) > 3  # every occurrence is recorded
    assert g.optimizer_steps == 3


def test_everything_is_restored_on_exit_even_after_a_violation() -> None:
    model, opt, sched, data = _setup()
    scaler = torch.amp.GradScaler("cpu")

    def own_zero_grad(set_to_none: bool = True) -> None:  # an instance attribute before us
        type(opt).zero_grad(opt, set_to_none)

    opt.zero_grad = own_zero_grad
    before = (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad.clip_grad_norm_,
              dict(opt.__dict__), dict(model.__dict__), dict(sched.__dict__),
              dict(scaler.__dict__))
    with pytest.raises(StepInsideWindowError), \
            guard(model, opt, accumulation_steps=K, scheduler=sched, scaler=scaler) as g:
        assert torch.nn.utils.clip_grad_norm_ is not before[0]
        _loop(model, opt, sched, data, "step_every_micro_step")
    after = (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad.clip_grad_norm_,
             dict(opt.__dict__), dict(model.__dict__), dict(sched.__dict__),
             dict(scaler.__dict__))
    assert after[0] is before[0] and after[1] is before[1]
    assert opt.zero_grad is own_zero_grad
    # no instance attribute of ours is left behind (torch adds its own bookkeeping keys)
    assert "zero_grad" not in vars(model) and "step" not in vars(sched)
    assert "unscale_" not in vars(scaler) and "update" not in vars(scaler)
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert not opt._optimizer_step_pre_hooks
    # an uninstalled guard no longer sees anything
    _loop(model, opt, sched, data, "step_every_micro_step")
    assert len(g.violations) == 1
    with pytest.raises(Exception, match="already installed"):
        g.install()
        g.install()
    g.close(check=False)


def test_phases_and_config_errors() -> None:
    model, opt, sched, data = _setup()
    g = AccumulationGuard(model, opt, accumulation_steps=2)
    with g:
        assert g.phase is Phase.OPEN
        token_loss(model, data[0])[0].backward()
        assert g.phase is Phase.ACCUMULATING
        token_loss(model, data[1])[0].backward()
        assert g.phase is Phase.FULL
        opt.step()
        assert g.phase is Phase.STEPPED
        opt.zero_grad()
    from accumguard import ConfigError

    for kwargs in ({"accumulation_steps": 0}, {"accumulation_steps": 2, "mode": "loud"},
                   {"accumulation_steps": 2, "sync": "sometimes"},
                   {"accumulation_steps": 2, "total_micro_batches": 0}):
        with pytest.raises(ConfigError):
            guard(model, opt, **kwargs)


def _scheduled_loop(kind: str, *, twice: bool = False) -> Any:
    import torch.optim.lr_scheduler as lrs

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = {"sequential": lambda: lrs.SequentialLR(
                 opt, [lrs.LambdaLR(opt, lambda s: 0.5), lrs.StepLR(opt, 2)], milestones=[2]),
             "chained": lambda: lrs.ChainedScheduler(
                 [lrs.LambdaLR(opt, lambda s: 0.5), lrs.StepLR(opt, 2)]),
             "warm_restarts": lambda: lrs.CosineAnnealingWarmRestarts(opt, 3),
             "lambda": lambda: lrs.LambdaLR(opt, lambda s: 1.0 / (1 + s))}[kind]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with guard(model, opt, accumulation_steps=4, scheduler=sched, mode="warn") as g:
            for i in range(16):
                model(torch.randn(3, 4)).sum().backward()
                if (i + 1) % 4 == 0:
                    opt.step()
                    sched.step()
                    if twice:
                        sched.step()
                    opt.zero_grad()
    return g


@pytest.mark.parametrize("kind", ["sequential", "chained", "warm_restarts", "lambda"])
def test_scheduler_steps_are_counted_once_constructor_excluded(kind: str) -> None:
    """Issue 23: scheduler counts exclude the scheduler's own constructor step, and count a
    scheduler whose class overrides step() (SequentialLR, ChainedScheduler,
    CosineAnnealingWarmRestarts): their correct loops read as F4 ('saw 0 scheduler.step()
    calls for 1 optimizer step') and a double step went unseen."""
    assert _scheduled_loop(kind).violations == []
    (first, *_) = _scheduled_loop(kind, twice=True).violations
    assert first.rule == "F4" and "2 scheduler steps for 1 optimizer step" in first.message, first
