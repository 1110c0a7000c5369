"""Host reads on the fast path (issue 13 item 3): none per micro-step, a fixed few per window.

On CPU there is no sync-debug mode, so the test counts the host reads themselves
(``Tensor.item``/``tolist``/``__float__``/``__bool__``) issued by accumguard while a window runs.
"""

from __future__ import annotations

import pytest
import torch

from accumguard import Accumulator
from accumguard.core.errors import UsageError
from accumguard.demo.toy import TokenMLP, count_tokens, token_loss


def _data(n: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [{"tokens": torch.randint(0, 32, (2, 6), generator=g),
             "labels": torch.randint(0, 32, (2, 6), generator=g)} for _ in range(n)]


def _reads_per_window(k: int, monkeypatch: pytest.MonkeyPatch, pass_count: bool) -> float:
    model = TokenMLP()
    acc = Accumulator(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=k,
                      count_fn=count_tokens)
    data = _data(3 * k)
    calls = {"n": 0}
    for name in ("item", "tolist", "__float__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *a: object, _real: object = real) -> object:
            calls["n"] += 1
            return _real(self, *a)  # type: ignore[operator]

        monkeypatch.setattr(torch.Tensor, name, counted)
    windows = 0
    for w in acc.windows(data):
        for micro in w:
            with micro:
                s, n = token_loss(model, micro.batch)
                calls_before = calls["n"]
                micro.backward(s, n if pass_count else None)
                assert calls["n"] == calls_before, "a host read inside backward()"
        windows += 1
    monkeypatch.undo()
    return calls["n"] / windows


def test_host_reads_do_not_grow_with_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss function itself reads nothing on the host here, so every counted read is
    accumguard's (plus the toy count_fn's, per micro-batch before the window)."""
    for pass_count in (False, True):
        small = _reads_per_window(2, monkeypatch, pass_count)
        large = _reads_per_window(8, monkeypatch, pass_count)
        print(f"pass_count={pass_count}: host reads per window K=2 {small}, K=8 {large}")
        # count_fn results (tensors) are stacked on the device: no read per micro-batch
        assert large == small, (pass_count, small, large)


def test_tensor_count_mismatch_is_caught_at_the_boundary() -> None:
    model = TokenMLP()
    before = [p.detach().clone() for p in model.parameters()]
    acc = Accumulator(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=2,
                      count_fn=count_tokens)
    w = next(acc.windows(_data(2)))
    with pytest.raises(UsageError, match="count=1 but count_fn reported .*micro-step 0"):
        for micro in w:
            with micro:
                s, n = token_loss(model, micro.batch)
                micro.backward(s, torch.ones_like(n) if micro.index == 0 else n)
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(),
                                                          strict=True))
    assert acc.optimizer_steps == 0 and w.result is not None and w.result.skipped
