"""Sampled observation (``Observer(sampled_records=True)``, what the framework callbacks run
with ``every_n_steps`` > 1) and the token-weight probe's records.

Unsampled windows must cost nothing the callbacks do not need: no root hook, no checksum,
no step record; a reset inside one must still make the next windows checked. The probe's
records, computed in one batch at the step, must equal the per-micro-step quantities
computed directly from the logits and labels in float64."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from accumguard.observe import FORCED_CHECKS, Observer, sampled
from accumguard.observe.tokens import TokenWeightProbe


class Steps:
    """A listener keeping the step records."""

    def __init__(self) -> None:
        self.steps: list[Any] = []

    def on_step(self, ev: Any) -> None:
        self.steps.append(ev)


def test_the_sample_is_one_window_per_block_with_a_moving_phase() -> None:
    for every in (2, 3, 10):
        picked = [s for s in range(every * every * 3) if sampled(s, every)]
        blocks = [s // every for s in picked]
        assert picked[0] == 0 and blocks == sorted(set(blocks)) == list(range(every * 3))
        # every phase comes round: a pattern repeating with a period dividing N is seen
        assert {s % every for s in picked} == set(range(every))
    assert all(sampled(s, 1) for s in range(5))


def _run(windows: int, *, every: int, k: int = 2, zero_inside_at: tuple[int, ...] = (),
         clip_inside_at: tuple[int, ...] = (), long_at: tuple[int, ...] = ()
         ) -> tuple[Steps, list[int]]:
    """A plain SGD loop under a sampled observer (K = ``k``); returns its records and, per
    window, how many forward hooks the model carried during it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Steps()
    obs = Observer(roots=[model], every=every, sampled_records=True, record_losses=False,
                   window_loss=False, window_size=k)
    obs.add_listener(rec)
    hooks = []
    with obs:
        for w in range(windows):
            hooks.append(len(model._forward_pre_hooks) + len(model._forward_hooks))
            for i in range(k + (w in long_at)):
                model(torch.randn(3, 4)).pow(2).mean().backward()
                if w in zero_inside_at and i == 0:
                    opt.zero_grad()  # a reset between backwards: the window loses micro 0
                if w in clip_inside_at and i == 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            opt.step()
            opt.zero_grad()
    assert len(model._forward_pre_hooks) + len(model._forward_hooks) == 0  # all removed
    return rec, hooks


def test_only_sampled_windows_are_hooked_checked_and_recorded() -> None:
    rec, hooks = _run(9, every=3)
    assert [ev.step for ev in rec.steps] == [0, 5, 7]  # sampled(): 0, then 5 and 7
    assert hooks == [1, 0, 0, 0, 0, 1, 0, 1, 0]  # the root pre-hook on sampled windows only
    assert all(ev.backwards == 2 and ev.conservation is not None and ev.conservation.ok
               for ev in rec.steps)


def test_a_reset_inside_an_unsampled_window_is_recorded_and_forces_the_next_windows() -> None:
    rec, hooks = _run(8, every=4, zero_inside_at=(1,))
    forced = list(range(2, 2 + FORCED_CHECKS))
    assert [ev.step for ev in rec.steps] == [0, 1, *forced, 7]
    reset = rec.steps[1]
    assert reset.zero_grads_between == 1 and reset.conservation is None  # no checksum there
    assert reset.sync_micros == [None, None]  # unarmed: flags unknown, not guessed
    assert hooks[1] == 0 and all(hooks[s] == 1 for s in forced)
    # the forced windows are checked whatever the budget; their gradients are conserved
    assert all(ev.conservation is not None and ev.conservation.ok for ev in rec.steps[2:])


def test_unusual_unsampled_windows_are_recorded() -> None:
    # a clip before the last backward, a window of K + 1 backwards: counted without hooks
    rec, _ = _run(6, every=10, clip_inside_at=(2,), long_at=(4,))
    assert [ev.step for ev in rec.steps] == [0, 2, 4]
    assert rec.steps[1].clip_micros == [1] and rec.steps[2].backwards == 3


def test_without_sampling_every_window_is_recorded() -> None:
    rec, hooks = _run(4, every=1)
    assert [ev.step for ev in rec.steps] == [0, 1, 2, 3] and hooks == [1, 1, 1, 1]


def _direct(logits: torch.Tensor, labels: torch.Tensor, s: float) -> list[float]:
    """(valid tokens, Σ s·(1−p_y), Σ (1−p_y)) over the tokens whose label is not -100."""
    valid = labels != -100
    p = torch.softmax(logits.double(), -1)
    py = p[valid].gather(1, labels[valid, None]).squeeze(1)
    return [float(valid.sum()), float((s * (1 - py)).sum()), float((1 - py).sum())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_probe_records_equal_the_direct_quantities(dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    head = torch.nn.Linear(8, 11).to(dtype)
    probe = TokenWeightProbe(head)
    expected = []
    for tokens, s in ((13, 0.05), (5, 0.2), (21, 0.01)):  # uneven counts, own weights
        x = torch.randn(tokens, 8, dtype=dtype)
        labels = torch.randint(0, 11, (tokens,))
        labels[::4] = -100  # ignored tokens: an all-zero gradient row
        logits = head(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum") * s
        loss.backward()
        expected.append(_direct(logits.detach(), labels, s))
    probe.scale = 2.0  # an exact path's boundary rescale multiplies the weights only
    got = probe.take()
    probe.close()
    assert got.shape == (3, 4) and got.dtype == torch.float64
    want = torch.tensor(expected, dtype=torch.float64)
    want[:, 1] *= 2.0
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 logits and gradient rounding
    torch.testing.assert_close(got[:, :3], want, rtol=tol, atol=tol)
    # a token cross-entropy's gradient rows: the signature error is rounding only
    assert float(got[:, 3].max()) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert probe.take().shape == (0, 4) and probe.low_precision == (dtype != torch.float32)


def test_probe_records_keep_their_precision_at_a_million_tokens() -> None:
    # The per-micro-step sums run over every token: accumulated in fp32 one row after
    # another, their error grew with the count (1e-3 of the weight at 256 k tokens). The
    # records of two micro-steps of 2^20 tokens each, with p_y small (1 - p_y near 1, as in
    # a large vocabulary), must sum to their fp64 values.
    probe = TokenWeightProbe(torch.nn.Linear(2, 2))
    probe.close()  # fed by hand below
    n, want = 1 << 20, []
    for s, nll in ((0.3 / n, 7.0), (0.7 / n, 5.0)):
        one_minus_p = -torch.expm1(torch.tensor(-nll, dtype=torch.float64))
        gy = torch.full((n,), -s * float(one_minus_p), dtype=torch.float32)
        probe.records.append((gy, torch.full((n,), nll, dtype=torch.float32),
                              torch.zeros(n), -2 * gy,  # a cross-entropy row's sums
                              torch.zeros(n), torch.zeros(n),  # the largest other entry
                              torch.zeros(n), torch.zeros(n)))  # the least probable one
        one_minus_p32 = -torch.expm1(torch.tensor(-nll, dtype=torch.float32)).double()
        want.append([n, -n * float(gy[0].double()), n * float(one_minus_p32)])
    got = probe.take()[:, :3]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0)
