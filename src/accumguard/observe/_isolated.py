"""One rule of the judge behind a wall (pure Python): accumguard's own bug in a rule, met on a
recording no test had, is noted with its traceback and the other rules still run."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import TypeVar, cast

from accumguard.observe._records import RunRecording

__all__ = ["Isolated"]

_T = TypeVar("_T")


class Isolated:
    """Runs one rule behind a wall: its exception becomes a line of
    ``rec.judge_failures`` (which rule, the error, its traceback) and its result the
    ``default`` (no findings), so the other rules still run."""

    def __init__(self, rec: RunRecording) -> None:
        self.rec = rec

    def __call__(self, name: str, fn: Callable[..., _T], *args: object,
                 default: _T | None = None) -> _T:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - accumguard's own bug: reported, not raised
            self.rec.judge_failures.append({
                "rule": name, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()})
            return cast(_T, []) if default is None else default
