"""Bad input gets a clear error (what was seen, what was expected, the fix); nothing hangs."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard import (
    AccumguardWarning,
    Accumulator,
    ConfigError,
    DistributedError,
    RankFailedError,
    UsageError,
)
from accumguard.demo.toy import IGNORE_INDEX, TokenMLP, count_tokens, make_rank_batches, token_loss


def _setup(k: int = 2, **kw):
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acc = Accumulator(model, opt, accumulation_steps=k, count_fn=count_tokens, **kw)
    data = make_rank_batches(seed=0, world_size=1, micro_batches=4)[0]
    return model, opt, acc, data


@pytest.mark.parametrize("k", [0, -3, 2.5, "4", None])
def test_bad_k(k: object) -> None:
    model = TokenMLP()
    with pytest.raises(ConfigError, match=r"accumulation_steps.*positive int.*micro-batches"):
        Accumulator(model, torch.optim.SGD(model.parameters(), lr=1), accumulation_steps=k)


def test_bad_normalization_and_clip() -> None:
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=1)
    with pytest.raises(ConfigError, match="normalization.*'sum'"):
        Accumulator(model, opt, accumulation_steps=2, normalization="avg")
    with pytest.raises(ConfigError, match="max_grad_norm.*positive"):
        Accumulator(model, opt, accumulation_steps=2, max_grad_norm=-1.0)


def test_missing_optimizer() -> None:
    with pytest.raises(ConfigError, match="optimizer is None"):
        Accumulator(TokenMLP(), None, accumulation_steps=2)


def test_loss_not_scalar() -> None:
    model, _, acc, data = _setup()
    window = next(acc.windows(data))
    micro = next(iter(window))
    with pytest.raises(UsageError, match=r"scalar loss tensor, got a tensor of shape"), micro:
        micro.backward(model(micro.batch["tokens"]).sum(-1))
    with pytest.raises(UsageError, match="got a float"), micro:
        micro.backward(1.0)  # type: ignore[arg-type]


def test_backward_twice() -> None:
    model, _, acc, data = _setup()
    window = next(acc.windows(data))
    micro = next(iter(window))
    with pytest.raises(UsageError, match="backward\\(\\) called twice in micro-step 0"), micro:
        micro.backward(token_loss(model, micro.batch)[0])
        micro.backward(token_loss(model, micro.batch)[0])


def test_micro_step_without_backward() -> None:
    _, _, acc, data = _setup()
    window = next(acc.windows(data))
    with pytest.raises(UsageError, match="ended without backward"), next(iter(window)):
        pass


def test_leaving_a_window_early_is_refused() -> None:
    model, _, acc, data = _setup(k=2)
    windows = acc.windows(data)
    window = next(windows)
    with next(iter(window)) as micro:
        micro.backward(token_loss(model, micro.batch)[0])
    with pytest.raises(UsageError, match="left after 1 of 2 micro-steps.*F7"):
        next(windows)


def test_empty_iterator() -> None:
    _, _, acc, _ = _setup()
    with pytest.raises(UsageError, match="yielded no micro-batch.*generator can be consumed"):
        list(acc.windows(iter([])))


def test_count_mismatch_and_mode_mixing() -> None:
    model, _, acc, data = _setup()
    micro = next(iter(next(acc.windows(data))))
    with pytest.raises(UsageError, match="count=1 but count_fn reported"), micro:
        micro.backward(token_loss(model, micro.batch)[0], count=1)
    model = TokenMLP()
    acc = Accumulator(model, torch.optim.SGD(model.parameters(), lr=1), accumulation_steps=2,
                      normalization="mean")
    micro = next(iter(next(acc.windows(data))))
    with pytest.raises(UsageError, match="normalization='mean' ignores counts"), micro:
        s, n = token_loss(model, micro.batch)
        micro.backward(s / n, count=n)


def test_mean_mode_refuses_unequal_micro_batches() -> None:
    model = TokenMLP()
    acc = Accumulator(model, torch.optim.SGD(model.parameters(), lr=1), accumulation_steps=2,
                      normalization="mean")
    data = make_rank_batches(seed=0, world_size=1, micro_batches=4, vary_batch_size=True,
                             micro_batch_size=8)[0]
    with pytest.raises(ConfigError, match="equal-size micro-batches.*F5.*normalization='sum'"):
        next(acc.windows(data))


def test_zero_count_window_skips_the_step_and_says_so() -> None:
    model, opt, acc, data = _setup(k=2)
    empty = [{"tokens": b["tokens"], "labels": torch.full_like(b["labels"], IGNORE_INDEX)}
             for b in data[:2]]
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for window in acc.windows(empty + data[2:]):
            window.run(lambda b: token_loss(model, b)[0])
    assert any(issubclass(w.category, AccumguardWarning) and "count 0" in str(w.message)
               for w in caught)
    assert acc.skipped_windows == 1 and acc.optimizer_steps == 1
    assert [r.skipped for r in acc.history] == [True, False]
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_state_dict_mid_window_and_mismatched_resume() -> None:
    model, _, acc, data = _setup(k=2)
    window = next(acc.windows(data))
    with next(iter(window)) as micro:
        micro.backward(token_loss(model, micro.batch)[0])
    with pytest.raises(UsageError, match=r"middle of window 0 \(1 of 2 micro-steps"):
        acc.state_dict()
    _, _, other, _ = _setup(k=2)
    state = other.state_dict()
    _, _, acc3, _ = _setup(k=3)
    with pytest.raises(ConfigError, match="accumulation_steps=2.*changes the effective batch"):
        acc3.load_state_dict(state)


def _uneven_ranks(rank: int, world: int) -> None:
    torch.manual_seed(0)
    model = DDP(TokenMLP())
    acc = Accumulator(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=2,
                      count_fn=count_tokens)
    n = 4 if rank == 0 else 3  # rank 1 runs out one micro-batch early
    data = make_rank_batches(seed=rank, world_size=1, micro_batches=n)[0]
    for window in acc.windows(data):
        window.run(lambda b: token_loss(model, b)[0])


def _uneven_ranks_caught(rank: int, world: int) -> tuple[str, str]:
    """:func:`_uneven_ranks` with its error caught in the rank: (error type, message).
    Neither rank may hang: the spawn of the module fixture then completes."""
    try:
        _uneven_ranks(rank, world)
    except DistributedError as err:
        return type(err).__name__, str(err)
    return "no error", ""


def test_ranks_with_different_micro_batch_counts_error_instead_of_hanging(
        in_a_group: list[dict]) -> None:
    """Both ranks raise DistributedError at the window whose counts differ (rank 1 ran out
    one micro-batch early), neither waits in a collective the other never enters. (Caught
    in the ranks of the module's one spawn; that a rank's error reaches the caller as
    RankFailedError with its traceback is tests/runtime/test_launch.py's.)"""
    for rank, (kind, msg) in enumerate(run["uneven"] for run in in_a_group):
        assert kind == "DistributedError", (rank, kind, msg)
        assert "different numbers of micro-batches in window 1: [2, 1]" in msg, msg
    assert issubclass(RankFailedError, DistributedError)


def test_exception_in_a_micro_step_aborts_only_its_window() -> None:
    """A caught error (say an OOM skipped on purpose) discards the window; training goes on
    exactly as if the window had never been there."""
    model, opt, acc, data = _setup(k=2)
    torch.manual_seed(0)
    clean = TokenMLP()
    clean.load_state_dict(model.state_dict())
    clean_acc = Accumulator(clean, torch.optim.SGD(clean.parameters(), lr=0.1),
                            accumulation_steps=2, count_fn=count_tokens)
    windows = acc.windows(data)
    window = next(windows)
    for micro in window:
        try:
            with micro:
                micro.backward(token_loss(model, micro.batch)[0])
                if micro.index == 1:
                    raise MemoryError("pretend out of memory")
        except MemoryError:
            break
    assert window.aborted and window.result is not None and window.result.skipped
    assert all(p.grad is None for p in model.parameters())
    for w in windows:
        w.run(lambda b: token_loss(model, b)[0])
    for w in clean_acc.windows(data[2:]):
        w.run(lambda b: token_loss(clean, b)[0])
    assert acc.optimizer_steps == 1 and acc.skipped_windows == 1
    for a, b in zip(model.parameters(), clean.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_step_skipped_by_the_grad_scaler_is_reported_as_skipped() -> None:
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    acc = Accumulator(model, opt, accumulation_steps=2, count_fn=count_tokens,
                      scheduler=sched, scaler=scaler)
    before = [p.detach().clone() for p in model.parameters()]
    data = make_rank_batches(seed=0, world_size=1, micro_batches=2)[0]
    for w in acc.windows(data):
        w.run(lambda b: token_loss(model, b)[0] * float("inf"))  # an overflowing loss
    assert acc.history[-1].skipped and acc.optimizer_steps == 0
    assert opt.param_groups[0]["lr"] == 0.1  # the scheduler did not run ahead of the optimizer
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def _local_engine_in_a_group(rank: int, world: int) -> list:
    out = []
    for mode in ("sum", "mean"):
        torch.manual_seed(0)
        model = TokenMLP()
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        acc = Accumulator(model, opt, accumulation_steps=2, normalization=mode,
                          count_fn=count_tokens if mode == "sum" else None)
        data = make_rank_batches(seed=rank, world_size=1, micro_batches=2, uneven=False)[0]
        for w in acc.windows(data):
            w.run(lambda b, mode=mode, model=model: token_loss(model, b)[0] if mode == "sum"
                  else token_loss(model, b)[0] / count_tokens(b))
        out.append([p.detach().clone() for p in model.parameters()])
    return out


def _in_a_group(rank: int, world: int) -> dict:
    """The three 2-rank checks of this module in ONE spawn (a spawn costs more than all
    three); the uneven ranks' error last, after the others' collectives."""
    return {"local": _local_engine_in_a_group(rank, world), "hooks": _two_hooks(rank, world),
            "uneven": _uneven_ranks_caught(rank, world)}


@pytest.fixture(scope="module")
def in_a_group(torch_spawn: dict[str, list[Any]]) -> list[dict]:
    """:func:`_in_a_group`'s per-rank results, from the torch-only spawn shared with the other
    DDP modules of tests/accumulate (tests/ds_spawn.py; this module's worker runs last)."""
    out: list[dict] = torch_spawn["test_accumulator_errors"]
    return out


def test_local_engine_ignores_an_existing_process_group(in_a_group: list[dict]) -> None:
    """An unwrapped model trains on this process's data alone, in both modes, even under
    torch.distributed: no all-gather another rank could miss, no division by W."""
    for sum_params, mean_params in (run["local"] for run in in_a_group):
        for a, b in zip(sum_params, mean_params, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _two_hooks(rank: int, world: int) -> str:
    from accumguard.engines.ddp import DDPEngine

    model = DDP(TokenMLP())
    DDPEngine(model)
    try:
        DDPEngine(model)
    except ConfigError as err:
        return str(err)
    return "no error"


def test_a_second_counting_hook_is_a_clear_error(in_a_group: list[dict]) -> None:
    msg = in_a_group[0]["hooks"]
    assert "count_collectives=False" in msg


def test_boundary_callbacks_see_each_step_once_with_its_numbers() -> None:
    """on_boundary: one call per optimizer step with N, the LR used and the pre-clip norm."""
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    seen = []
    acc = Accumulator(model, opt, accumulation_steps=3, scheduler=sched, max_grad_norm=0.01,
                      count_fn=count_tokens, on_boundary=[seen.append])
    data = make_rank_batches(seed=0, world_size=1, micro_batches=7)[0]
    for w in acc.windows(data):
        w.run(lambda b: token_loss(model, b)[0])
    assert [r.step for r in seen] == [1, 2, 3]
    assert [r.micro_steps for r in seen] == [3, 3, 1]
    assert [r.lrs for r in seen] == [(0.5,), (0.25,), (0.125,)]
    expected_counts = [sum(float(count_tokens(b)) for b in data[i:i + 3]) for i in (0, 3, 6)]
    assert [r.count for r in seen] == expected_counts
    assert all(r.grad_norm is not None and float(r.grad_norm) > 0.01 for r in seen)
