"""F4 and F13 claims that only the source can make, kept when the run confirms what they
rest on.

A learning-rate schedule written by hand (a callback that sets ``param_groups[i]["lr"]``
from a micro-batch counter, a timm-style ``step_update(num_updates)``, a horizon computed
from ``len(train_dataloader)``) has no horizon the run can read: ``watch`` sees the rates,
not the step number the schedule meant. ``lint`` reads that number in the source. Its F4
errors are kept in the watch report only when the run shows the two facts every such claim
rests on: the optimizer stepped once per K >= 2 backward passes, and the rate changed
during the run (a schedule acted); and only when the run's own rules said nothing about
the schedule (no F4 finding at any level: a file may hold several modes, and a rate the run
judged itself, as a token-count schedule's warning, is the run's word).

A resume's arithmetic (the iteration counter restored one past the iteration the checkpoint
saved still to run: a whole window skipped) is not in the run either: its windows are K
long, only the batch never trained on is missing. Lint's F13 error on it is kept when the
run resumed (an optimizer's state was loaded) and the run's rules made no F13 error.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median
from typing import Any

from accumguard.observe._records import Finding, RunRecording, _mk

__all__ = ["resume_source_findings", "schedule_source_findings"]

#: lint's F13 rules about a resume's own arithmetic (what the run cannot show)
_RESUME_CODES = ("AG318", "AG327")


def _lint_f4(command: Sequence[str]) -> tuple[str, list[Any]] | None:
    from accumguard.watch._declared import script_lint_errors

    found = script_lint_errors(command)
    hits = [] if found is None else [f for f in found[1] if f.cls == "F4"]
    return (found[0].name, hits) if found is not None and hits else None


def _confirmed(rec: RunRecording) -> tuple[int, int, list[float]] | None:
    """(K, steps, the first and last rate) of the first rank with steps, when its optimizer
    stepped once per K >= 2 backwards (the median window) and its rate changed."""
    for r in rec.ranks:
        steps = [s for s in rec.steps.get(r, []) if s.get("applied", True)]
        if len(steps) < 2:
            continue
        k = int(median(int(s.get("backwards", 0) or 0) for s in steps))
        rates = [float(s["lr"]) for s in steps if isinstance(s.get("lr"), (int, float))]
        if k < 2 or len({round(x, 12) for x in rates}) < 2:
            return None
        return k, len(steps), [rates[0], rates[-1]]
    return None


def schedule_source_findings(rec: RunRecording, findings: list[Finding],
                             command: Sequence[str]) -> list[Finding]:
    """The script's F4 errors (lint), confirmed by the run, when the run's rules made no F4
    finding (see the module); [] otherwise."""
    if any(f.cls == "F4" for f in findings):
        return []  # the run judged its schedule itself (a warning or note is its own view)
    confirmed = _confirmed(rec)
    if confirmed is None:
        return []
    said = _lint_f4(command)
    if said is None:
        return []
    name, hits = said
    k, n, (first, last) = confirmed
    hit = hits[0]
    return [_mk("F4", "error", None, 0, None,
                f"{name}:{hit.line}: {hit.evidence} (read in the script, lint {hit.code}); "
                f"the run shows what that rests on: the optimizer stepped once per {k} "
                f"backward passes ({n} steps) and the learning rate changed during the run "
                f"({first:.4g} at the first step, {last:.4g} at the last)",
                title_=hit.title, fix=hit.fix)]


def resume_source_findings(rec: RunRecording, findings: list[Finding],
                           command: Sequence[str]) -> list[Finding]:
    """The script's F13 resume errors (lint), when the run resumed from a checkpoint (an
    optimizer ``load_state_dict``) and its rules made no F13 error; [] otherwise."""
    if any(f.cls == "F13" and f.severity == "error" for f in findings):
        return []
    loads = sorted({int(s) for e in rec.end.values() for s in e.get("state_loads") or []})
    if not loads:
        return []
    from accumguard.watch._declared import script_lint_errors

    found = script_lint_errors(command)
    hits = [] if found is None else [f for f in found[1] if f.code in _RESUME_CODES]
    if found is None or not hits:
        return []
    hit = hits[0]
    at = ", ".join(f"step {s + 1}" for s in loads[:4])
    return [_mk("F13", "error", None, 0, None,
                f"{found[0].name}:{hit.line}: {hit.evidence} (read in the script, lint "
                f"{hit.code}); the run resumed: an optimizer's state was loaded before "
                f"optimizer {at}",
                title_=hit.title, fix=hit.fix)]
