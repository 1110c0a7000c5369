"""Property tests of the single-process Accumulator and of the non-finite policy: random K, random numbers and sizes of micro-batches (empty ones too),
partial and dropped final windows, counts passed or not, exceptions in random micro-steps,
NaN/Inf losses and gradients at random places, skip or raise, with or without clipping.

The oracle is an independent float64 computation of what the optimizer must receive per
window: G = Σ ∇loss_i / N over the window's micro-batches (N = their rows), one SGD step;
windows with no rows, aborted windows and windows with a non-finite value are skipped.

Examples: :data:`EXAMPLES` per test (400 by default), chosen by hypothesis's derandomized
search, so every run (CI included) tries the same inputs and a failure reproduces. 2,000
random examples each cost ~28 s per test in CI (14 ms per example); 400 find the bug these
tests found first (a NaN loss with no gradient path, stepped on one process) in every run.
Set ``ACCUMGUARD_PROPERTY_EXAMPLES=5000`` for a longer search.
"""

from __future__ import annotations

import math
import os
import warnings

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from accumguard import Accumulator
from accumguard.core.errors import NonFiniteError

LR = 0.1
CLIP = 0.5
#: examples per property test (see the module docstring)
EXAMPLES = int(os.environ.get("ACCUMGUARD_PROPERTY_EXAMPLES", "400"))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1).double()


def _batches(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(len(sizes) * 31 + sum(sizes))
    return [(torch.randn(n, 3, generator=g, dtype=torch.float64),
             torch.randn(n, 1, generator=g, dtype=torch.float64)) for n in sizes]


def _loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor],
          bad: str | None = None) -> torch.Tensor:
    x, y = batch
    loss = ((model(x) - y) ** 2).sum()
    if bad == "nan":
        return loss * math.nan
    if bad == "inf":
        return loss + math.inf
    if bad == "grad":  # a finite loss with a NaN gradient
        return loss + torch.sqrt((model.weight * 0).sum())
    return loss


def _oracle(sizes: list[int], k: int, drop_last: bool, dropped: set[int],
            clip: float | None) -> tuple[list[torch.Tensor], list[bool]]:
    """Expected final parameters and the skipped flag of every window."""
    model = _model()
    batches = _batches(sizes)
    windows = [batches[i:i + k] for i in range(0, len(batches), k)]
    if drop_last and windows and len(windows[-1]) < k:
        windows.pop()
    skipped = []
    for w, window in enumerate(windows):
        n = sum(b[0].shape[0] for b in window)
        if n == 0 or w in dropped:
            skipped.append(True)
            continue
        skipped.append(False)
        total = sum(_loss(model, b) for b in window) / n
        grads = torch.autograd.grad(total, list(model.parameters()))
        if clip is not None:
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            grads = tuple(g * min(1.0, clip / (float(norm) + 1e-6)) for g in grads)
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads, strict=True):
                p -= LR * g
    return [p.detach() for p in model.parameters()], skipped


SIZES = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=8)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(k=st.integers(min_value=1, max_value=4), sizes=SIZES, drop_last=st.booleans(),
       pass_count=st.booleans(), abort_at=st.none() | st.tuples(st.integers(0, 4),
                                                                  st.integers(0, 3)))
def test_accumulator_matches_the_large_batch_oracle(k: int, sizes: list[int], drop_last: bool,
                                                    pass_count: bool,
                                                    abort_at: tuple[int, int] | None) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    acc = Accumulator(model, opt, accumulation_steps=k, drop_last_window=drop_last,
                      count_fn=lambda b: b[0].shape[0])
    aborted: set[int] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for w in acc.windows(_batches(sizes)):
            try:
                for micro in w:
                    with micro:
                        if (w.index, micro.index) == abort_at:
                            aborted.add(w.index)
                            raise KeyError("user error in a micro-step")
                        loss = _loss(model, micro.batch)
                        micro.backward(loss, micro.count if pass_count else None)
            except KeyError:
                pass
    expected, skipped = _oracle(sizes, k, drop_last, aborted, None)
    assert [r.skipped for r in acc.history] == skipped
    assert acc.optimizer_steps == skipped.count(False)
    assert acc.skipped_windows == skipped.count(True)
    assert acc.micro_batches_consumed == len(sizes)
    for r, start in zip(acc.history, range(0, len(sizes), k), strict=False):
        assert r.count == sum(sizes[start:start + k]) and (r.skip_reason is None) != r.skipped
    for a, b in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-12)
    state = acc.state_dict()
    again = Accumulator(model, opt, accumulation_steps=k, drop_last_window=drop_last)
    again.load_state_dict(state)
    assert again.state_dict() == state


POISON = st.dictionaries(st.tuples(st.integers(0, 4), st.integers(0, 3)),
                         st.sampled_from(["nan", "inf", "grad"]), max_size=3)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(k=st.integers(min_value=1, max_value=4), sizes=SIZES, poison=POISON,
       mode=st.sampled_from(["skip", "raise"]), clip=st.sampled_from([None, CLIP]))
def test_nonfinite_windows_are_skipped_and_nothing_else(k: int, sizes: list[int],
                                                        poison: dict, mode: str,
                                                        clip: float | None) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=1.0)
    acc = Accumulator(model, opt, accumulation_steps=k, count_fn=lambda b: b[0].shape[0],
                      nonfinite=mode, max_grad_norm=clip, scheduler=sched)  # type: ignore[arg-type]
    hit: set[int] = set()
    raised: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for w in acc.windows(_batches(sizes)):
            try:
                for micro in w:
                    with micro:
                        bad = poison.get((w.index, micro.index))
                        if bad is not None:
                            hit.add(w.index)
                        micro.backward(_loss(model, micro.batch, bad))
            except NonFiniteError as err:
                raised.append(err.window)
    # A poisoned window with no rows still has no step to skip: it is skipped as empty.
    expected, skipped = _oracle(sizes, k, False, hit, clip)
    assert [r.skipped for r in acc.history] == skipped
    assert all(torch.isfinite(p).all() for p in model.parameters())
    for a, b in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-12)
    assert sched.last_epoch == acc.optimizer_steps  # held on every skipped window
    nonempty_hits = sorted(w for w in hit if sum(sizes[w * k:(w + 1) * k]) > 0)
    notices = [c for c in caught if "skipped on every rank" in str(c.message)]
    if mode == "raise":
        assert raised == nonempty_hits and not notices
    else:
        assert not raised and len(notices) == len(nonempty_hits)
