"""Assertions for a team's own CI: "our accumulation is equivalent to the large batch".

::

    from accumguard.verify.testing import assert_accumulation_equivalent

    def test_our_loop_is_the_large_batch():
        assert_accumulation_equivalent(SETUP, our_loop, world_size=2, steps=3)

Built on :func:`accumguard.verify.audit.audit` (imported when first called): the loop runs on
``world_size`` real ranks and is compared, step by step, with the fp64
single-process reference of the same setup. On failure the assertion message
carries the first diverging step and parameter, the per-step counts and the
diagnosed failure class with its fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from accumguard.core.errors import ConfigError
from accumguard.verify.contract import AuditSetup, Loop

__all__ = ["NotEquivalentError", "assert_accumulation_equivalent"]


class NotEquivalentError(AssertionError):
    """Raised by :func:`assert_accumulation_equivalent`; an ``AssertionError`` so that
    pytest shows it as a test failure. ``reports`` holds every loop's AuditReport."""

    def __init__(self, message: str, reports: dict[str, Any]) -> None:
        super().__init__(message)
        self.reports = reports


def assert_accumulation_equivalent(setup: AuditSetup, loop: Loop | Mapping[str, Loop], *,
                                   world_size: int = 2,
                                   accumulation_steps: int | None = None, steps: int | None = 3,
                                   engine: str | None = None, tolerance: float | None = None,
                                   timeout: float = 300) -> Any:
    """Fail (``AssertionError``) unless ``loop`` trains exactly like the large batch.

    Args:
        setup: the :class:`~accumguard.verify.contract.AuditSetup` of the run.
        loop: ``loop(ctx)``, the training loop under test (module-level function), or
            ``{"name": loop, ...}`` to check several loops in one spawn (every one must
            pass; the message lists each that does not).
        world_size: ranks to spawn (gloo on CPU).
        accumulation_steps: override ``setup.accumulation_steps`` (K).
        steps: optimizer steps to check (K·steps micro-batches per rank); None: all data.
        engine: if given, the engine the audit must see the loop use (``"ddp"``,
            ``"fsdp2"``, ``"deepspeed"``, ``"zero1"``, ``"local"``): a loop that
            silently fell back to another wrapper fails.
        tolerance: bound on the relative update error (default: from the dtype).
        timeout: hard limit in seconds for the whole run.

    Returns the :class:`~accumguard.verify.audit.AuditReport` when it passes (a dict of them
    for a dict of loops).
    """
    if not isinstance(setup, AuditSetup):
        raise ConfigError(f"setup must be an AuditSetup, got {type(setup).__name__}")
    if accumulation_steps is not None and accumulation_steps != setup.accumulation_steps:
        setup = dataclasses.replace(setup, accumulation_steps=accumulation_steps)
    from accumguard.verify.audit import audit_many

    loops = dict(loop) if isinstance(loop, Mapping) else {getattr(loop, "__name__", "loop"): loop}
    reports = audit_many(setup, loops, world_size=world_size, steps=steps, tolerance=tolerance,
                         timeout=timeout)
    messages = []
    for report in reports.values():
        problems = list(report.failures)
        if engine is not None and report.engine != engine:
            problems.append(f"the loop ran on engine {report.engine!r}, expected {engine!r}")
        if not report.passed or problems:
            messages.append(_explain(report, problems))
    if messages:
        raise NotEquivalentError("\n".join(messages), reports)
    return reports if isinstance(loop, Mapping) else next(iter(reports.values()))


def _explain(report: Any, problems: list[str]) -> str:
    lines = [f"accumulation is NOT equivalent to the large batch for loop {report.name!r} "
             f"(world_size={report.world_size}, K={report.accumulation_steps}, "
             f"engine={report.engine}):"]
    lines += [f"  - {p}" for p in problems]
    lines.append(f"  max relative update error {report.max_update_error:.3g} "
                 f"(tolerance {report.tolerance:.1g}: {report.tolerance_reason})")
    d = report.first_divergence
    if d is not None:
        lines.append(f"  first divergence: step {d.step}, parameter {d.parameter}, max abs diff "
                     f"{d.max_abs_diff:.3g}, max rel diff {d.max_rel_diff:.3g}")
    lines.append(f"  optimizer steps {report.optimizer_steps} (reference "
                 f"{report.reference_steps}); per step: "
                 + ", ".join(f"{k}={v:g}" for k, v in report.counts_per_step().items() if v))
    diag = report.diagnosis
    if diag is not None:
        lines.append(f"  diagnosis: {diag.summary()}")
        if getattr(diag, "fix", None):
            lines.append(f"  fix: {diag.fix}")
    return "\n".join(lines)
