"""The collective ledger in the framework callbacks' checked steps.

:class:`CheckedLedger` books every gradient and parameter collective of the window
(:class:`~accumguard.observe._comm_ledger.CommLedger`: DDP's bucket all-reduces, FSDP2's
reduce-scatters and all-gathers, hand-written ones; op, bytes, micro-step) on the
callbacks' observer, and at each step the observer records (the checked ones) compares it
with the closed form of a deferred window (:func:`accumguard.observe._comm_rules.comm_findings`,
the rule ``watch`` runs). A deferral that does nothing, or a sync on every micro-step, is
the EXTRA_SYNC **warning** with its extra collectives and bytes per optimizer step and,
where Python timed them, their share of the step's time; never an error (the optimizer
receives the same gradient), so it never stops a ``strict`` run. Said once per run (the
same loop repeats it every step); the last checked step's counts are in
:attr:`CheckedLedger.last`.

DeepSpeed windows are not judged (ZeRO-2/3 reduce inside every backward by design; see
:mod:`accumguard.observe._comm_rules`); their counts are still in :attr:`CheckedLedger.last`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from accumguard.observe._comm_ledger import CommLedger
from accumguard.observe._comm_rules import comm_findings, window_comm
from accumguard.observe._failsafe import hook_method
from accumguard.observe._records import step_record

if TYPE_CHECKING:
    from accumguard.core.findings import Finding
    from accumguard.core.window import StepRecord
    from accumguard.observe._failsafe import Failsafe

__all__ = ["CheckedLedger"]

log = logging.getLogger("accumguard")


class ChecksHost(Protocol):
    """What the ledger reads of :class:`~accumguard.integrations._checks.AccumulationChecks`
    (named by its shape: that module imports this one)."""

    observer: Any  # accumguard.observe.Observer (typed Any there)
    failsafe: Failsafe
    rank: int
    findings: list[Finding]
    on_finding: Callable[[Finding], None] | None


class CheckedLedger:
    """The callbacks' collective ledger and its warning (see the module).

    Args:
        checks: the :class:`~accumguard.integrations._checks.AccumulationChecks` whose
            observer it listens to and whose findings list it adds to.
    """

    def __init__(self, checks: ChecksHost) -> None:
        self.checks = checks
        self.failsafe = checks.failsafe  # the door of on_step (hook_method)
        observer = checks.observer
        self.ledger = CommLedger(observer)
        self.ledger.attach()
        # DDP's C++ all-reduces, booked per backward of the checked (sampled) windows only
        observer.add_listener(self.ledger, sampled_only=True)
        observer.add_listener(self)
        self.said = False
        #: the last checked step's ledger: ``step`` (0-based), ``rows`` (op, micro, inside
        #: a backward, calls, bytes, seconds) and, for DDP/FSDP2/hand-written windows, the
        #: split into the closed form's final round and the extra calls
        self.last: dict[str, Any] | None = None

    def on_step(self, ev: StepRecord) -> None:
        """Observer listener: a step the observer recorded (a checked window)."""
        self._ledger_step(ev)

    @hook_method
    def _ledger_step(self, ev: StepRecord) -> None:
        """The checked window's ledger against the closed form, behind the checks' door
        (fault-injection label ``hook:_ledger_step``)."""
        comm = self.ledger.take(ev.step)
        comm["window_s"] = ev.wall  # this window's time (the ledger's spans unchecked ones)
        rec = step_record(ev, self.checks.rank)
        rec["comm"] = comm
        self.last = {"step": ev.step, "engine": rec.get("engine"),
                     "rows": comm["rows"], "split": window_comm(rec)}
        if self.said:
            return
        found = comm_findings(self.checks.rank, [rec], [])
        for f in found:
            self._say(f)

    def _say(self, finding: Finding) -> None:
        """Added to the checks' findings and passed to ``on_finding``; logged on rank 0;
        never raised (a warning, even under ``strict``)."""
        self.said = True
        self.checks.findings.append(finding)
        if self.checks.on_finding is not None:
            self.checks.on_finding(finding)
        if self.checks.rank == 0:
            log.warning("%s", finding)
