"""A model copied (``copy.deepcopy``: an EMA, a teacher) or pickled whole (``torch.save(model)``)
while watch observes it: the hooks accumguard put on it must not make the copy or the save
fail (blind round 27, c_c02, raised ``cannot pickle '_thread._local'`` in the user's
``deepcopy`` before the fix), must not follow the copy into the user's file, and the run
must stay what it is unobserved."""

from __future__ import annotations

import copy
import io
import logging
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._hookref import UNPICKLED
from accumguard.watch._recording import recording

K = 3


def _train(model: torch.nn.Module, windows: int, copies: list[torch.nn.Module]) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    for s in range(windows):
        for _ in range(K):
            x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            (F.cross_entropy(model(x), y) / K).backward()
        opt.step()
        opt.zero_grad()
        if s in (0, 3):  # before and after the roots are pinned to the model
            ema = copy.deepcopy(model).requires_grad_(False)
            buf = io.BytesIO()
            torch.save(model, buf)
            buf.seek(0)
            loaded = torch.load(buf, weights_only=False)
            with torch.no_grad():
                x = torch.randn(2, 6, generator=g)
                assert torch.equal(ema(x), model(x)) and torch.equal(loaded(x), model(x))
            copies += [ema, loaded]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def test_deepcopy_and_save_of_an_observed_model(tmp_path: Path) -> None:
    plain, plain_copies = _model(), []
    _train(plain, 6, plain_copies)
    model, copies = _model(), []
    with recording(tmp_path) as obs:
        _train(model, 6, copies)
        assert obs.failure is None
        assert any(model._forward_pre_hooks.values()) or any(model._forward_hooks.values())
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    for ema in copies[::2]:  # a copy keeps only inert hooks: calling it does nothing of ours
        hooks = [*ema._forward_pre_hooks.values(), *ema._forward_hooks.values()]
        assert all(getattr(h, "inert", False) for h in hooks), hooks
    for loaded in copies[1::2]:  # a saved model holds only the standard-library no-op
        hooks = [*loaded._forward_pre_hooks.values(), *loaded._forward_hooks.values()]
        assert hooks and all(h == logging.getLogger(UNPICKLED).debug for h in hooks), hooks
    assert [r for r in (tmp_path / "rank-0.jsonl").read_text().splitlines()
            if '"kind": "step"' in r].__len__() == 6
