"""Shared test setup: isolate every test from a surrounding torchrun/elastic job."""

from __future__ import annotations

import os
import sys

import pytest

# Tests live in sub-folders mirroring the package; they share tests/helpers.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_LEAKY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _clean_dist_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key in _LEAKY or key.startswith("TORCHELASTIC_"):
            monkeypatch.delenv(key, raising=False)
