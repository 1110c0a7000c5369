"""The non-finite policy on one process: a window with a NaN/Inf loss or gradient is skipped
(no optimizer step, scheduler held, gradients discarded, one warning naming the window and
micro-step), or raises NonFiniteError with nonfinite="raise"; training goes on either way.

"Skipped" is checked exactly: the run equals, bit for bit, the same run without that
window's data (SGD with momentum, so a stray step or a leaked gradient would show).
The 2-rank engines (DDP, ZeRO-1, FSDP2, DeepSpeed) are in tests/engines/test_nonfinite_*.py.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch

from accumguard import AccumguardWarning, Accumulator, ConfigError
from accumguard.core.errors import NonFiniteError
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss

K = 2


def _make(**kw: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, Accumulator]:
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    acc = Accumulator(model, opt, accumulation_steps=K, count_fn=count_tokens, scheduler=sched,
                      **kw)
    return model, opt, sched, acc


def _loss(model: torch.nn.Module, bad: str | None) -> Any:
    def fn(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        s, _ = token_loss(model, batch)
        if bad == "nan":
            return s * math.nan
        if bad == "inf":
            return s + math.inf
        if bad == "grad":
            # A finite loss (sqrt(0) = 0) with a NaN gradient (d sqrt/du at 0 is inf, × 0).
            w = next(model.parameters())
            return s + torch.sqrt((w * 0).sum())
        return s

    return fn


def _train(bad_at: tuple[int, int] | None, kind: str = "nan", drop_window: int | None = None,
           **kw: Any) -> tuple[list[torch.Tensor], Accumulator, list[str], float]:
    """Train 4 windows; poison micro-step ``bad_at[1]`` of window ``bad_at[0]``."""
    model, opt, _, acc = _make(**kw)
    data = make_rank_batches(seed=0, world_size=1, micro_batches=4 * K)[0]
    if drop_window is not None:
        del data[drop_window * K:(drop_window + 1) * K]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for w in acc.windows(data):
            for micro in w:
                bad = kind if bad_at == (w.index, micro.index) else None
                with micro:
                    micro.backward(_loss(model, bad)(micro.batch))
    msgs = [str(c.message) for c in caught if issubclass(c.category, AccumguardWarning)]
    return [p.detach().clone() for p in model.parameters()], acc, msgs, opt.param_groups[0]["lr"]


@pytest.mark.parametrize("kind", ["nan", "inf", "grad"])
@pytest.mark.parametrize("clip", [None, 1.0])
def test_a_bad_window_is_skipped_exactly(kind: str, clip: float | None) -> None:
    params, acc, msgs, lr = _train((1, 1), kind, max_grad_norm=clip)
    clean, clean_acc, clean_msgs, clean_lr = _train(None, drop_window=1, max_grad_norm=clip)
    assert clean_msgs == []
    assert all(torch.isfinite(p).all() for p in params)
    # Skipping the window == never having seen its data: no step, no momentum, no leak.
    assert all(torch.equal(a, b) for a, b in zip(params, clean, strict=True))
    assert lr == clean_lr  # the scheduler was held
    assert acc.optimizer_steps == 3 and acc.skipped_windows == 1
    result = acc.history[1]
    assert result.skipped and result.loss is None and result.skip_reason
    assert [r.skipped for r in acc.history] == [False, True, False, False]
    assert len(msgs) == 1 and "window 1 skipped on every rank" in msgs[0]
    if kind == "grad":
        assert "reduced gradient holds NaN/Inf although every loss" in result.skip_reason
    else:
        assert "non-finite loss (NaN/Inf) at micro-step 1" in result.skip_reason
        assert "micro-step 1" in msgs[0]


def test_raise_mode_raises_after_discarding_the_window_and_training_goes_on() -> None:
    model, opt, _, acc = _make(nonfinite="raise")
    data = make_rank_batches(seed=0, world_size=1, micro_batches=3 * K)[0]
    raised = []
    for w in acc.windows(data):
        try:
            w.run(_loss(model, "nan" if w.index == 0 else None))
        except NonFiniteError as err:
            raised.append(err)
    assert len(raised) == 1 and raised[0].window == 0 and raised[0].ranks == {0: 0}
    assert "nonfinite='skip'" in str(raised[0])
    assert [r.skipped for r in acc.history] == [True, False, False]
    assert acc.optimizer_steps == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_raise_mode_also_raises_for_a_nan_gradient_with_a_finite_loss() -> None:
    model, _, _, acc = _make(nonfinite="raise")
    data = make_rank_batches(seed=0, world_size=1, micro_batches=K)[0]
    with pytest.raises(NonFiniteError, match="reduced gradient holds NaN/Inf") as info:
        for w in acc.windows(data):
            w.run(_loss(model, "grad"))
    assert info.value.ranks == {}


def test_grad_scaler_overflow_is_skipped_and_reported_but_never_raised() -> None:
    """fp16-style overflow under a GradScaler is routine (the scale adapts): reported as a
    skip with the scaler's reason, not an error, even with nonfinite='raise'."""
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    acc = Accumulator(model, opt, accumulation_steps=K, count_fn=count_tokens, scaler=scaler,
                      nonfinite="raise")
    data = make_rank_batches(seed=0, world_size=1, micro_batches=2 * K)[0]

    class Overflow(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * math.inf  # the scaled gradient overflows, the loss is finite

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for w in acc.windows(data):
            w.run(lambda b, i=w.index: Overflow.apply(token_loss(model, b)[0]) if i == 0
                  else token_loss(model, b)[0])
    first = acc.history[0]
    assert first.skipped and "GradScaler" in (first.skip_reason or "")
    assert "loss scale 65536 -> 32768" in (first.skip_reason or "")
    assert scaler.get_scale() < 2.0**16  # the scale backed off, as without accumguard
    assert not acc.history[1].skipped and acc.optimizer_steps == 1
    assert any("normal while an fp16 loss scale adapts" in str(c.message) for c in caught)


def test_bad_nonfinite_option() -> None:
    model = TokenMLP()
    with pytest.raises(ConfigError, match=r"`nonfinite` \('ignore'\) must be 'skip'"):
        Accumulator(model, torch.optim.SGD(model.parameters(), lr=1), accumulation_steps=2,
                    nonfinite="ignore")  # type: ignore[arg-type]
