"""Every bad input to the Accumulator ends in a library error that says what was seen, what
was expected and the fix: never a traceback from torch/Python internals, never a silent
wrong result, and never an ``assert`` (checked again under ``python -O``).

One table: (case id, action, error class, a piece of the message). docs/errors.md lists
the same errors with cause and fix.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from accumguard import Accumulator, ConfigError, UsageError
from accumguard.core.errors import AccumguardError
from accumguard.core.scaling import GradReduction, loss_scale
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss


def _model() -> TokenMLP:
    torch.manual_seed(0)
    return TokenMLP()


def _acc(**kw: Any) -> Accumulator:
    model = kw.pop("model", None) or _model()
    opt = kw.pop("optimizer", None) or torch.optim.SGD(model.parameters(), lr=0.1)
    kw.setdefault("count_fn", count_tokens)
    return Accumulator(model, opt, accumulation_steps=2, **kw)


def _data(n: int = 4) -> list[dict[str, torch.Tensor]]:
    return make_rank_batches(seed=0, world_size=1, micro_batches=n)[0]


def _run_counts(counts: list[Any]) -> None:
    it = iter(counts * 4)
    acc = _acc(count_fn=lambda b: next(it))
    model = acc.model
    for w in acc.windows(_data()):
        w.run(lambda b: token_loss(model, b)[0])


def _empty_optimizer() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.param_groups[0]["params"] = []
    Accumulator(model, opt, accumulation_steps=2)


def _foreign_optimizer() -> None:
    model = _model()
    Accumulator(model, torch.optim.SGD(_model().parameters(), lr=0.1), accumulation_steps=2)


def _detached_loss() -> None:
    acc = _acc()
    for w in acc.windows(_data()):
        w.run(lambda b: token_loss(acc.model, b)[0].detach())


def _no_grad_loss() -> None:
    acc = _acc()
    for w in acc.windows(_data()):
        def loss(b: Any) -> torch.Tensor:
            with torch.no_grad():
                return token_loss(acc.model, b)[0]
        w.run(loss)


def _backward_count(count: Any) -> Callable[[], None]:
    def run() -> None:
        acc = _acc()
        for w in acc.windows(_data()):
            w.run(lambda b: (token_loss(acc.model, b)[0], count))
    return run


def _load(state: Any) -> Callable[[], None]:
    return lambda: _acc().load_state_dict(state)


def _good_state() -> dict[str, Any]:
    return _acc().state_dict()


CASES: list[tuple[str, Callable[[], Any], type[AccumguardError], str]] = [
    ("model-is-a-string", lambda: Accumulator("model", None, accumulation_steps=2,
                                              engine="local"), ConfigError,
     "expected a torch.nn.Module"),
    ("model-is-a-string-auto", lambda: Accumulator("m", torch.optim.SGD(_model().parameters(),
                                                                        lr=1),
                                                   accumulation_steps=2), ConfigError,
     "expected a torch.nn.Module"),
    ("optimizer-is-a-list", lambda: _acc(optimizer=[torch.optim.SGD(_model().parameters(),
                                                                    lr=1)]),
     ConfigError, "expected a torch.optim.Optimizer instance"),
    ("optimizer-class", lambda: _acc(optimizer=torch.optim.SGD), ConfigError,
     "expected a torch.optim.Optimizer instance"),
    ("optimizer-empty", _empty_optimizer, ConfigError, "holds no parameters"),
    ("optimizer-of-another-model", _foreign_optimizer, ConfigError,
     "none of them belongs to the model"),
    ("scheduler-class", lambda: _acc(scheduler=torch.optim.lr_scheduler.StepLR), ConfigError,
     "LR scheduler instance"),
    ("scheduler-number", lambda: _acc(scheduler=0.1), ConfigError, "LR scheduler instance"),
    ("scaler-wrong", lambda: _acc(scaler="fp16"), ConfigError, "GradScaler instance"),
    ("count-fn-not-callable", lambda: _acc(count_fn=4), ConfigError, "must be a function"),
    ("on-boundary-not-callable", lambda: _acc(on_boundary=[1]), ConfigError, "not callable"),
    ("on-boundary-number", lambda: _acc(on_boundary=3), ConfigError, "list of callables"),
    ("max-grad-norm-bool", lambda: _acc(max_grad_norm=True), ConfigError,
     "positive finite number"),
    ("max-grad-norm-nan", lambda: _acc(max_grad_norm=math.nan), ConfigError,
     "positive finite number"),
    ("drop-last-window-str", lambda: _acc(drop_last_window="yes"), ConfigError,
     "True or False"),
    ("normalization-list", lambda: _acc(normalization=["sum"]), ConfigError,
     "must be 'sum'"),
    ("nonfinite-bad", lambda: _acc(nonfinite="warn"), ConfigError, "must be 'skip'"),
    ("data-none", lambda: next(_acc().windows(None)), UsageError,
     "expected an iterable of micro-batches"),
    ("data-int", lambda: next(_acc().windows(5)), UsageError,
     "expected an iterable of micro-batches"),
    ("data-str", lambda: next(_acc().windows("abc")), UsageError,
     "expected an iterable of micro-batches"),
    ("data-empty", lambda: next(_acc().windows([])), UsageError, "yielded no micro-batch"),
    ("count-negative", lambda: _run_counts([-4]), ConfigError, "negative, NaN or infinite"),
    ("count-nan", lambda: _run_counts([math.nan]), ConfigError, "negative, NaN or infinite"),
    ("count-inf", lambda: _run_counts([math.inf]), ConfigError, "negative, NaN or infinite"),
    ("count-negatives-sum-to-zero", lambda: _run_counts([3, -3]), ConfigError,
     "negative, NaN or infinite"),
    ("count-tensor-nan", lambda: _run_counts([torch.tensor(math.nan)]), ConfigError,
     "negative, NaN or infinite"),
    ("count-string", lambda: _run_counts(["4"]), ConfigError, "expected a real number >= 0"),
    ("count-none", lambda: _run_counts([None]), ConfigError, "expected a real number >= 0"),
    ("count-vector", lambda: _run_counts([torch.ones(3)]), ConfigError,
     "expected a real number >= 0"),
    ("count-bool", lambda: _run_counts([True]), ConfigError, "expected a real number >= 0"),
    ("count-complex", lambda: _run_counts([1 + 2j]), ConfigError,
     "expected a real number >= 0"),
    ("loss-detached", _detached_loss, UsageError, "does not require grad"),
    ("loss-no-grad", _no_grad_loss, UsageError, "does not require grad"),
    ("backward-count-string", _backward_count("x"), UsageError, "count='x'"),
    ("backward-count-vector", _backward_count(torch.ones(2)), UsageError, "count=a"),
    ("load-state-list", _load([1, 2]), ConfigError, "expected the dict returned by"),
    ("load-state-missing-keys", _load({"version": 1}), ConfigError, "lacks"),
    ("load-state-negative", _load({**_good_state(), "optimizer_steps": -1}), ConfigError,
     "non-negative ints"),
    ("load-state-other-k", _load({**_good_state(), "accumulation_steps": 3}), ConfigError,
     "Construct the Accumulator with the checkpoint's value"),
    ("loss-scale-zero-count", lambda: loss_scale(mode="sum", reduction=GradReduction(),
                                                 global_count=0, window_micro_steps=1),
     UsageError, "positive finite number of samples"),
    ("loss-scale-nan-count", lambda: loss_scale(mode="sum", reduction=GradReduction(),
                                                global_count=math.nan, window_micro_steps=1),
     UsageError, "positive finite number of samples"),
    ("loss-scale-mean-zero", lambda: loss_scale(mode="mean", reduction=GradReduction(),
                                                global_count=1, window_micro_steps=0),
     UsageError, "positive int"),
    ("loss-scale-mode", lambda: loss_scale(mode="avg", reduction=GradReduction(),
                                           global_count=1, window_micro_steps=1),
     ConfigError, "unknown normalisation mode"),
    ("loss-scale-bad-reduction", lambda: loss_scale(
        mode="sum", reduction=GradReduction(divides_by=math.nan), global_count=1,
        window_micro_steps=1), ConfigError, "reduction factor"),
]


@pytest.mark.parametrize(("case", "action", "error", "text"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_library_error(case: str, action: Callable[[], Any],
                                      error: type[AccumguardError], text: str) -> None:
    with pytest.raises(error) as info:
        action()
    message = str(info.value)
    assert text in message, message
    # What was expected and how to fix it: every message is a sentence with a way out.
    assert len(message) > 40 and any(w in message for w in (
        "expected", "must", "Pass", "pass", "Fix", "fix", "Use", "use", "Construct")), message


def test_no_assert_needed_under_python_O() -> None:
    """Under ``python -O`` asserts vanish: the count checks must still refuse."""
    code = (
        "import torch, math\n"
        "from accumguard import Accumulator, ConfigError\n"
        "from accumguard.demo.toy import TokenMLP, make_rank_batches, token_loss\n"
        "m = TokenMLP(); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for bad in (-4.0, math.nan):\n"
        "    acc = Accumulator(m, opt, accumulation_steps=2, count_fn=lambda b: bad)\n"
        "    try:\n"
        "        for w in acc.windows(make_rank_batches(seed=0, world_size=1,\n"
        "                                               micro_batches=2)[0]):\n"
        "            w.run(lambda b: token_loss(m, b)[0])\n"
        "    except ConfigError as e:\n"
        "        print('refused', bad)\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         timeout=300)  # importing torch alone took >120 s at load ~20
    assert out.stdout.split("\n")[:2] == ["refused -4.0", "refused nan"], out.stderr[-2000:]
