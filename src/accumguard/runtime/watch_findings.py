"""From the per-rank recordings of ``accumguard watch`` to findings.

The rules themselves live one layer down, in :mod:`accumguard.observe.rules`, so that
the framework callbacks (:mod:`accumguard.integrations`) apply the same ones live;
this module is the name ``watch``, ``invariance`` and their tests import them by.
"""

from __future__ import annotations

from accumguard.observe.rules import (
    NUMBERING,
    Finding,
    KResolution,
    RunRecording,
    analyze,
    load_recordings,
    resolve_k,
)

__all__ = ["NUMBERING", "Finding", "KResolution", "RunRecording", "analyze", "load_recordings",
           "resolve_k"]
