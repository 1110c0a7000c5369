"""Engine adapters: one module per engine, one protocol (:mod:`accumguard.engines.base`).

:func:`resolve_engine` picks the adapter from the wrapped model's type, so the
common case needs no ``engine=`` argument. Optional engines (DeepSpeed) are
imported only when their model type is seen.
"""

from __future__ import annotations

from typing import Any

import torch

from accumguard.engines.base import Engine
from accumguard.errors import ConfigError

__all__ = ["Engine", "resolve_engine"]

_NAMES = ("auto", "local", "ddp", "fsdp2", "zero1", "deepspeed")


def _is_fsdp2(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def _is_deepspeed(model: Any) -> bool:
    return any(c.__module__.startswith("deepspeed.") and c.__name__ == "DeepSpeedEngine"
               for c in type(model).__mro__)


def resolve_engine(model: Any, optimizer: Any = None, engine: str | Engine = "auto",
                   **options: Any) -> Engine:
    """Return the adapter for ``model``: an :class:`Engine` instance is used as given;
    a name selects the adapter; ``"auto"`` infers it from the model/optimizer types."""
    if isinstance(engine, Engine):
        if options:
            raise ConfigError(f"engine options {sorted(options)} given together with an Engine "
                              "instance; pass them to the adapter's constructor instead")
        return engine
    if engine not in _NAMES:
        raise ConfigError(f"engine ({engine!r}) must be an Engine instance or one of {_NAMES}")
    from torch.nn.parallel import DistributedDataParallel

    if engine == "auto":
        if _is_deepspeed(model):
            engine = "deepspeed"
        elif isinstance(model, DistributedDataParallel):
            zero = type(optimizer).__name__ == "ZeroRedundancyOptimizer"
            engine = "zero1" if zero else "ddp"
        elif _is_fsdp2(model):
            engine = "fsdp2"
        else:
            engine = "local"
    if engine == "local":
        from accumguard.engines.local import LocalEngine

        return LocalEngine(model, **options)
    if engine == "ddp":
        from accumguard.engines.ddp import DDPEngine

        return DDPEngine(model, **options)
    if engine == "fsdp2":
        from accumguard.engines.fsdp2 import FSDP2Engine

        return FSDP2Engine(model, **options)
    if engine == "zero1":
        from accumguard.engines.zero1 import Zero1Engine

        return Zero1Engine(model, optimizer, **options)
    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter

    return DeepSpeedEngineAdapter(model, **options)
