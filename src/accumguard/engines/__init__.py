"""Engine adapters: one module per engine, one protocol (:mod:`accumguard.engines.base`).

:func:`resolve_engine` (in :mod:`.registry`, the only place that detects engines)
picks the adapter from the wrapped model's type, so the common case needs no
``engine=`` argument. Optional engines (DeepSpeed) are imported only when their
model type is seen. To add an engine, see :mod:`.registry`.
"""

from accumguard.engines.base import Engine
from accumguard.engines.registry import detect_engine, resolve_engine

__all__ = ["Engine", "detect_engine", "resolve_engine"]
