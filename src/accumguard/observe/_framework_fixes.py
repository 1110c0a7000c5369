"""The fix in the idiom of the framework that drove the run: the rules' findings give their
class's generic fix (bare optimizer calls, DDP's ``model.no_sync()``); where the observer saw
a Lightning Trainer, the HF TrainingArguments or Accelerate's backward (the end record's
``frameworks``), :func:`framework_fixes` gives the class's fix in that framework's words
(:func:`accumguard.core.taxonomy.fix_in`)."""

from __future__ import annotations

import dataclasses

from accumguard.core.findings import Finding
from accumguard.core.taxonomy import fix_for, fix_in
from accumguard.observe._records import RunRecording

__all__ = ["framework_fixes", "frameworks"]


def frameworks(rec: RunRecording) -> set[str]:
    """The training frameworks any rank saw driving the run (its end record)."""
    out: set[str] = set()
    for end in rec.end.values():
        names = end.get("frameworks")
        if isinstance(names, list):
            out.update(str(n) for n in names)
    return out


#: Classes whose findings word their fix for the engine (model.no_sync() for DDP): a
#: framework's own idiom replaces it when that fix is DDP's.
_SYNC_CLASSES = ("F11", "EXTRA_SYNC")


def framework_fixes(findings: list[Finding], used: set[str]) -> list[Finding]:
    """The fix of each finding in the idiom of the framework that drove the run (Lightning,
    the HF Trainer, Accelerate: :func:`~accumguard.core.taxonomy.fix_in`) where the
    finding gave its class's generic fix, DDP's no_sync() for a sync class, or DeepSpeed's
    ``engine.backward`` (which the framework calls, not the user); a fix a rule worded from
    what it measured (a horizon, a clip's numbers) is kept."""
    if not used:
        return findings
    out = []
    for f in findings:
        fix = fix_in(f.cls, used)
        generic = f.fix == fix_for(f.cls) or (f.cls in _SYNC_CLASSES and "no_sync" in f.fix) \
            or "engine.backward(" in f.fix  # (DeepSpeed's call: a framework made it for you)
        out.append(dataclasses.replace(f, fix=fix) if fix is not None and generic else f)
    return out
