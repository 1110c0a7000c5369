"""Each product builds its observer from one named configuration (``observe/_profiles``),
and the observer it gets has exactly that configuration: the runtime guard, ``watch``'s
recording and the framework callbacks' checks."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import torch

from accumguard.observe import _profiles as profiles
from accumguard.observe._observer import Observer

FIELDS = [f.name for f in dataclasses.fields(profiles.ObserverProfile) if f.name != "name"]


def _config(obs: Observer) -> dict[str, object]:
    names = {"conservation": "check_conservation"}
    return {f: getattr(obs, names.get(f, f)) for f in FIELDS}


def _want(profile: profiles.ObserverProfile) -> dict[str, object]:
    return {f: getattr(profile, f) for f in FIELDS}


def test_the_guard_observes_with_the_guard_profile() -> None:
    from accumguard.runtime.guard import guard

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = guard(model, opt, accumulation_steps=2, mode="warn").install()
    try:
        assert g.observer is not None
        assert _config(g.observer) == _want(profiles.guard())
        assert g.observer.attribute and not g.observer.record_losses
    finally:
        g.close()


def test_watch_records_with_the_watch_profile(tmp_path: Path) -> None:
    from accumguard.watch import recording

    with recording(tmp_path) as obs:
        assert _config(obs) == _want(profiles.watch())
        assert obs.auto_roots and obs.record_losses


def test_the_callbacks_check_with_the_callbacks_profile() -> None:
    from accumguard.integrations._checks import AccumulationChecks

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    checks = AccumulationChecks(model, opt, accumulation_steps=4, every_n_steps=10)
    try:
        assert checks.observer is not None
        assert _config(checks.observer) == _want(profiles.callbacks(10, 4))
        assert checks.observer.sampled_records and checks.observer.window_size == 4
        # the collective ledger listens to the checked windows' backwards only: the other
        # windows' backwards stay unobserved (counted without hooks)
        assert checks.comm is not None and not checks.observer._wants_backwards
    finally:
        checks.close()
