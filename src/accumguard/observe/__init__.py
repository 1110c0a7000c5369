"""The one observation layer (hooks on backward, optimizers, zero_grad, schedulers,
clipping, sync flags, collectives, engine configs), shared by the guard, ``accumguard
watch`` and (later) the audit.

:class:`Observer` installs every patch (each keeps the wrapped signature and is removed
on ``uninstall``) and turns the process into events (:mod:`._events`) for listeners:
the runtime guard checks them live, ``watch`` records them per rank. Gradient
conservation (what reaches the optimizer equals the sum of the micro-steps'
contributions) is computed from cheap checksums (:mod:`._checksum`); collectives are
counted in one place (:mod:`._collectives`).
"""

from __future__ import annotations

import importlib
from typing import Any

# Lazy (PEP 562): the watch bootstrap imports ``accumguard.observe._imports`` in every
# process before torch is imported; this package must not import torch itself.
_EXPORTS = {
    "BackwardEvent": "_events", "ClipEvent": "_events", "EngineInfo": "_events",
    "ForwardEvent": "_events", "SchedulerEvent": "_events", "StepEvent": "_events",
    "ZeroGradEvent": "_events", "CollectiveCounter": "_collectives",
    "Conservation": "_checksum", "checksums": "_checksum", "conservation": "_checksum",
    "CONSERVATION_BUDGET": "_checksum", "FORCED_CHECKS": "_checksum", "sampled": "_checksum",
    "Observer": "_observer", "when_imported": "_imports", "Patches": "_patch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accumguard.observe' has no attribute {name!r}")
    return getattr(importlib.import_module(f"accumguard.observe.{module}"), name)
