"""Engine adapters: one module per engine, one protocol (:mod:`accumguard.engines.base`).

:func:`resolve_engine` (in :mod:`.registry`, the only place that detects engines)
picks the adapter from the wrapped model's type, so the common case needs no
``engine=`` argument. Optional engines (DeepSpeed) are imported only when their
model type is seen. To add an engine, see :mod:`.registry`.

The package's own names are imported on first use (PEP 562): importing a submodule that
needs no torch (:mod:`.collectives`, pure data) does not import torch, so the ``watch``
command-line process, which only starts the command and reads its records, never does.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accumguard.engines.base import Engine
    from accumguard.engines.registry import detect_engine, resolve_engine

__all__ = ["Engine", "detect_engine", "resolve_engine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from accumguard.engines.base import Engine
        return Engine
    if name in ("detect_engine", "resolve_engine"):
        from accumguard.engines import registry
        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
