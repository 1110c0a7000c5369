"""The records the demo produces, shared by the runners (:mod:`.demo`, :mod:`.frameworks`),
the console (:mod:`.console`) and the plots (:mod:`.plots`): kept apart so that none of
them imports another's module for a type (no import cycle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DemoRow", "FrameworkRow"]


@dataclass
class DemoRow:
    """One cell of the matrix: a loop on an engine, what was expected, what was seen."""

    engine: str
    loop: str
    kind: str
    expected: str
    description: str
    verdict: str                 # PASS | FAIL | SKIP | ERROR
    as_expected: bool | None     # None: not run (skipped)
    max_update_error: float | None = None
    diagnosis: str | None = None
    diagnosis_summary: str | None = None
    runner_up: str | None = None
    collectives_per_step: float | None = None
    optimizer_steps: int | None = None
    reference_steps: int | None = None
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.engine}/{self.loop}"


@dataclass
class FrameworkRow:
    """One run: a framework's broken default or the accumguard way, judged."""

    framework: str
    run: str  # "broken" or "exact"
    label: str
    expected: str  # "F5" (broken) or "pass"
    verdict: str  # PASS, FAIL, SKIP, ERROR
    as_expected: bool | None
    max_update_error: float | None = None
    update_errors: list[float] = field(default_factory=list)
    window_sizes: list[int] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    short: str = ""  # the run in a few words (the PNG's legend)

    @property
    def classes(self) -> list[str]:
        return sorted({f["class_id"] for f in self.findings})
