"""Work a tool adds per optimizer step, counted rather than timed.

The timed ratios of the benchmarks are what the bars are about, but on a shared machine
their noise is a few percent. The number of Python function calls a run makes is
deterministic: counted (``sys.setprofile``) for the plain loop and for the same loop with
the tool installed, it shows how much per-step work the tool adds, whatever the load.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def python_calls(run: Callable[[], Any]) -> int:
    """Python function calls made while ``run()`` executes (C functions not counted)."""
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls
