"""Shared test setup: isolate every test from a surrounding torchrun/elastic job."""

from __future__ import annotations

import os

import pytest

_LEAKY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _clean_dist_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key in _LEAKY or key.startswith("TORCHELASTIC_"):
            monkeypatch.delenv(key, raising=False)
