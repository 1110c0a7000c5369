"""``accumguard invariance``: the user's own script, run once per K at one effective batch.

The check people run by hand when they suspect accumulation: train the same
script with K = 1 and K = 4 (micro-batch B and B/4), same seeds, same data
order, and compare step by step. With exact accumulation the two runs are the
same training up to floating-point rounding; a loss normalised per micro-batch
(F5), a scheduler stepped per micro-step (F4), a boundary reset (F2/F3) ... all
show as a different *update* from the first optimizer step on.

What is compared, per optimizer step (numbered from 1 for the user):

* the window loss as the script computed it: the sum of ``float(loss)`` over
  the backward calls of the step and over the ranks, relative difference to
  the reference K (the first of ``ks``);
* the parameter update Δθ = θ_after − θ_before, as
  ``||Δθ_K − Δθ_ref|| / ||Δθ_ref||`` over all parameters and ranks (each rank's
  local shard compared with the same rank's shard: ZeRO/FSDP shards and DDP
  replicas alike).

The verdict rests on the update, which is what training is: a script that
logs ``K ×`` the loss but steps identically is not diverged (a note says so).
The loss decides only for steps whose update was not recorded.

The recording comes from the one observation layer (:mod:`accumguard.observe`)
injected into every process of the command by the one bootstrap of ``accumguard
watch`` (which also applies the seed/dropout hooks of
:mod:`accumguard.observe.invariance_hooks`): ``rank-<R>.jsonl`` step records and
``updates-rank-<R>.pt`` update lists in one directory per K.

This module is the public face; each job lives in its own module:
``_options`` (options, placeholders, refusing a command that cannot vary K),
``_records`` (loading a run's recording), ``_compare`` (step by
step comparison), ``_tolerance`` (the bound from the recorded dtypes and K), ``_report`` (report, JSON, watch findings)
and ``_run`` (the child processes). Parsing and comparing are pure (testable
on synthetic records); :func:`run_invariance` adds the child processes.
"""

from __future__ import annotations

from accumguard.invariance._compare import KComparison, StepComparison, compare_runs
from accumguard.invariance._options import (
    ENV_BATCH,
    ENV_K,
    ENV_MB,
    ENV_NO_DROPOUT,
    ENV_SEED,
    PLACEHOLDER_K,
    PLACEHOLDER_MB,
    CommandFailedError,
    InvarianceOptions,
    check_command,
    expand_command,
    micro_batch,
    parse_ks,
)
from accumguard.invariance._records import RunRecord, StepRow, load_run
from accumguard.invariance._report import (
    JSON_VERSION,
    InvarianceReport,
    build_report,
    watch_findings,
)
from accumguard.invariance._run import run_invariance
from accumguard.invariance._tolerance import FP32_TOLERANCE, invariance_tolerance

__all__ = [
    "InvarianceOptions",
    "RunRecord",
    "StepRow",
    "StepComparison",
    "KComparison",
    "InvarianceReport",
    "CommandFailedError",
    "parse_ks",
    "micro_batch",
    "expand_command",
    "check_command",
    "invariance_tolerance",
    "load_run",
    "compare_runs",
    "build_report",
    "run_invariance",
    "watch_findings",
    "JSON_VERSION",
    "FP32_TOLERANCE",
    "PLACEHOLDER_K",
    "PLACEHOLDER_MB",
    "ENV_K",
    "ENV_MB",
    "ENV_BATCH",
    "ENV_SEED",
    "ENV_NO_DROPOUT",
]


def __getattr__(name: str) -> object:
    """``StepRecord``, the old name of one step across ranks: now :class:`StepRow`, which
    holds every rank's window record (:class:`accumguard.core.window.StepRecord`) and reads
    ``index``, ``window_loss``, ``backwards`` and ``applied`` from them. One more release."""
    if name == "StepRecord":
        import warnings

        warnings.warn("accumguard.invariance.StepRecord is now StepRow (the old name goes "
                      "away in the next release)", DeprecationWarning, stacklevel=2)
        return StepRow
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
