"""Engine detection and lookup: the one place that knows which adapter serves a model.

Built-in adapters are registered here by name with a cheap *detector* that looks
at types only (it never imports an optional engine such as DeepSpeed). Third
parties join ``engine="auto"`` through the ``accumguard.engines`` entry-point
group: the entry point names an :class:`~accumguard.engines.base.Engine`
subclass that defines a ``name`` and a classmethod ``matches(model, optimizer)``.
Detectors are tried in registration order, third-party ones first, so a more
specific wrapper (ZeRO-1 over DDP) is found before the general one.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from accumguard.core.errors import ConfigError
from accumguard.engines.base import Engine

if TYPE_CHECKING:
    import torch
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["ENGINE_NAMES", "EngineSpec", "detect_engine", "is_deepspeed_engine", "resolve_engine"]


def _mro_names(obj: object) -> list[tuple[str, str]]:
    return [(c.__module__, c.__name__) for c in type(obj).__mro__]


def is_deepspeed_engine(obj: object) -> bool:
    """True for a ``deepspeed.DeepSpeedEngine`` (or subclass) without importing DeepSpeed."""
    return any(m.startswith("deepspeed") and n == "DeepSpeedEngine" for m, n in _mro_names(obj))


def is_ddp(obj: object) -> TypeGuard[DistributedDataParallel]:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(obj, DistributedDataParallel)


def is_fsdp2(obj: object) -> bool:
    """True for a module wrapped by FSDP2 ``fully_shard`` (the root or any sharded child)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return isinstance(obj, FSDPModule)


def is_zero_redundancy_optimizer(obj: object) -> bool:
    return any(n == "ZeroRedundancyOptimizer" for _, n in _mro_names(obj))


@dataclass(frozen=True)
class EngineSpec:
    """A registered adapter: its name, where it lives, and how to recognise its model."""

    name: str
    target: str  # "module:Class"
    matches: Callable[[object, object], bool]
    takes_optimizer: bool = False

    def load(self) -> type[Engine]:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


_BUILTIN = (
    EngineSpec("deepspeed", "accumguard.engines.deepspeed:DeepSpeedEngineAdapter",
               lambda m, o: is_deepspeed_engine(m)),
    EngineSpec("zero1", "accumguard.engines.zero1:Zero1Engine",
               lambda m, o: is_ddp(m) and is_zero_redundancy_optimizer(o), takes_optimizer=True),
    EngineSpec("ddp", "accumguard.engines.ddp:DDPEngine", lambda m, o: is_ddp(m)),
    EngineSpec("fsdp2", "accumguard.engines.fsdp2:FSDP2Engine", lambda m, o: is_fsdp2(m)),
    EngineSpec("local", "accumguard.engines.local:LocalEngine", lambda m, o: True),
)

ENGINE_NAMES = ("auto", *(s.name for s in _BUILTIN))


@functools.lru_cache(maxsize=1)
def _third_party() -> tuple[EngineSpec, ...]:
    """Entry-point adapters, read once per process: scanning every installed distribution's
    metadata costs ~25 ms, which an Accumulator built per test case (or per epoch) would pay
    each time. ``_third_party.cache_clear()`` re-reads them."""
    from importlib.metadata import entry_points

    specs = []
    for ep in entry_points(group="accumguard.engines"):
        cls = ep.load()
        matches = getattr(cls, "matches", None)
        if not (isinstance(cls, type) and issubclass(cls, Engine) and callable(matches)):
            raise ConfigError(
                f"entry point {ep.name!r} in group 'accumguard.engines' names {cls!r}; expected "
                "an accumguard Engine subclass with a classmethod matches(model, optimizer)")
        specs.append(EngineSpec(getattr(cls, "name", ep.name), f"{cls.__module__}:{cls.__name__}",
                                matches))
    return tuple(specs)


def _specs() -> list[EngineSpec]:
    return [*_third_party(), *_BUILTIN]


def detect_engine(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str:
    """The name of the adapter that serves ``model`` (``"local"`` for a plain module)."""
    for spec in _specs():
        if spec.matches(model, optimizer):
            return spec.name
    return "local"  # pragma: no cover - "local" matches everything


def resolve_engine(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                   engine: str | Engine = "auto", **options: Any) -> Engine:
    """Return the adapter for ``model``: an :class:`Engine` instance is used as given;
    a name selects the adapter; ``"auto"`` infers it from the model/optimizer types."""
    if isinstance(engine, Engine):
        if options:
            raise ConfigError(f"engine options {sorted(options)} given together with an Engine "
                              "instance; pass them to the adapter's constructor instead")
        return engine
    specs = {s.name: s for s in _specs()}
    if not isinstance(engine, str) or (engine != "auto" and engine not in specs):
        raise ConfigError(f"engine ({engine!r}) must be an Engine instance or one of "
                          f"{('auto', *specs)}")
    name = detect_engine(model, optimizer) if engine == "auto" else engine
    spec = specs[name]
    # an adapter's constructor: (model, **options), or (model, optimizer, **options)
    make: Callable[..., Engine] = spec.load()
    if spec.takes_optimizer:
        return make(model, optimizer, **options)
    return make(model, **options)
