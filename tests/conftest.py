"""Shared test setup: isolate every test from a surrounding torchrun/elastic job."""

from __future__ import annotations

import os
import sys

import pytest

# Tests live in sub-folders mirroring the package; they share tests/helpers.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Count DDP's gradient all-reduces in every test (the counting comm hook is off by default in
# production; see accumguard.engines.ddp). Set here so that spawned ranks inherit it.
os.environ.setdefault("ACCUMGUARD_COUNT_COLLECTIVES", "1")

_LEAKY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _clean_dist_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key in _LEAKY or key.startswith("TORCHELASTIC_"):
            monkeypatch.delenv(key, raising=False)


def pytest_sessionstart(session: pytest.Session) -> None:
    """DeepSpeed is part of the ``dev`` extra: its tests must run, never be skipped silently.
    Set ACCUMGUARD_ALLOW_NO_DEEPSPEED=1 to run the rest of the suite without it on purpose."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None and not os.environ.get(
            "ACCUMGUARD_ALLOW_NO_DEEPSPEED"):
        raise pytest.UsageError(
            "deepspeed is not installed, so the DeepSpeed tests would be skipped; install the "
            "dev extra (pip install -e '.[dev]') or set ACCUMGUARD_ALLOW_NO_DEEPSPEED=1")
