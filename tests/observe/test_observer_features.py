"""The Observer as the framework callbacks and the guard build it (given root, attribution,
sampled records), in this process, on the single-process loops of
``tests/watch_scripts/features.py``: the observed run's parameters are bit-identical to the
unobserved run's, every optimizer step is seen, and no conservation verdict is broken on
these correct loops. (``test_watch_features`` runs the same loops under ``accumguard
watch`` and on DDP/FSDP2.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from accumguard.observe import Observer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "watch_scripts"))
import features  # noqa: E402

# the features that need no other process or compiler (those run in test_watch_features)
CHEAP = [f for f in features.APPLIES["plain"]
         if f not in ("compile_inductor", "workers", "subprocess")]


class _Steps:
    def __init__(self) -> None:
        self.steps: list[Any] = []

    def on_step(self, ev: Any) -> None:
        self.steps.append(ev)


@pytest.mark.parametrize("sampled", [False, True], ids=["guard", "callback"])
@pytest.mark.parametrize("feature", CHEAP)
def test_given_root_observer_changes_nothing(feature: str, sampled: bool) -> None:
    features.ENGINE = "plain"
    ref = features.FEATURES[feature]()
    observers: list[tuple[Observer, _Steps]] = []

    def attach(model: torch.nn.Module) -> None:
        if observers:  # a model wrapped again (the resize): the first observer stays
            return
        if sampled:  # as the framework callbacks build it
            obs = Observer(roots=[model], conservation=True, every=1, record_losses=False,
                           window_loss=False, sampled_records=True,
                           window_size=features.K)
        else:  # as the guard builds it
            obs = Observer(roots=[model], conservation=True, every=1, attribute=True,
                           record_losses=False)
        rec = _Steps()
        obs.add_listener(rec)
        obs.install()
        observers.append((obs, rec))

    features.ON_WRAP.append(attach)
    try:
        got = features.FEATURES[feature]()
    finally:
        features.ON_WRAP.remove(attach)
        for obs, _ in observers:
            obs.uninstall()
    differ = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not differ, differ
    assert observers, "the feature wrapped no model"
    steps = observers[0][1].steps
    assert [s.step for s in steps] == list(range(features.STEPS))
    broken = [(s.step, s.conservation) for s in steps
              if s.conservation is not None and not s.conservation.ok]
    assert not broken, broken
    if feature != "autograd_grad":  # no backward pass to bracket
        assert steps[0].conservation is not None


def test_a_layer_unfrozen_after_the_first_forward_is_checked() -> None:
    """A layer frozen when the model is first seen, unfrozen at the second step, is tracked
    from then on: a gradient wiped on it alone in the third window breaks that window's
    conservation verdict (before, only the parameters that required a gradient at the
    first forward were ever checksummed: this wipe went unseen)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = _Steps()
    obs = Observer(auto_roots=True, every=1)
    obs.add_listener(rec)
    with obs:
        for step in range(3):
            if step == 1:
                for p in model[0].parameters():
                    p.requires_grad_(True)
            for micro in range(2):
                if (step, micro) == (2, 1):
                    model[0].weight.grad = None  # the bug: one layer's gradient dropped
                x = torch.randn(4, 4, generator=torch.Generator().manual_seed(step * 2 + micro))
                (model(x).pow(2).mean() / 2).backward()
            opt.step()
            opt.zero_grad()
    verdicts = [s.conservation for s in rec.steps]
    assert verdicts[0] is not None and verdicts[0].ok and verdicts[1].ok
    assert verdicts[2] is not None and not verdicts[2].ok, verdicts[2]
    assert verdicts[2].reason == "wiped"


def test_a_replaced_parameter_is_not_kept_alive() -> None:
    """An embedding resized after the first step (the old weight replaced, the optimizer
    rebuilt) is checked from the next window on, and the observer does not keep the old
    weight in memory (it did: every parameter ever tracked stayed referenced)."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = features.TokenNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rec = _Steps()
    obs = Observer(auto_roots=True, every=1)
    obs.add_listener(rec)
    with obs:
        for step in range(3):
            if step == 1:
                old = model.emb
                model.emb = torch.nn.Embedding(16, old.embedding_dim)
                gone = weakref.ref(old.weight)
                del old
                opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            for micro in range(2):
                t, y = features.tokens(step, micro, vocab=12)
                (torch.nn.functional.cross_entropy(model(t), y) / 2).backward()
            opt.step()
            opt.zero_grad()
        gc.collect()
        assert gone() is None, "the observer keeps the replaced weight alive"
    verdicts = [s.conservation for s in rec.steps]
    assert all(v is not None and v.ok for v in verdicts), verdicts
    assert any(p is model.emb.weight for p in obs._tracked)  # the new weight is checked
