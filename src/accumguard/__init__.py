"""accumguard: gradient accumulation that provably equals the large batch.

The public API is small: :class:`Accumulator` drives any supported engine
correctly; :class:`Boundary` is the framework-free state machine behind it;
:func:`run_on_ranks` runs a function on real distributed ranks;
:func:`reference_run` is the single-process truth everything is compared to;
:func:`guard` watches any training loop at run time. The products the CLI has:
:mod:`accumguard.watch` (``watch.run(cmd)``, ``watch.judge(dir)``; the package can be
called like the function it was, ``accumguard.watch(cmd)``), :mod:`accumguard.invariance`
(``run_invariance``, ``InvarianceOptions``, also importable from here), :func:`audit` and
:func:`lint_paths`.

Imports are lazy (PEP 562): ``import accumguard`` costs nothing until a name is
used, so ``accumguard.static`` runs without torch and the pytest plugin does not
slow down every test session. Layers, bottom up (each imports only lower ones):
``core`` → ``static`` | ``engines`` → ``accumulate`` → ``observe`` →
``integrations`` → ``runtime`` → ``watch`` → ``verify`` → ``invariance`` → ``advise``
→ ``demo`` | ``cli``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from accumguard import _moved

#: the products that are packages: ``accumguard.watch`` (a module that can be called like
#: the function it was: ``accumguard.watch(cmd)`` is ``accumguard.watch.run(cmd)``) and
#: ``accumguard.invariance``
_PACKAGES = ("invariance", "watch")

# public name -> module that defines it
_EXPORTS = {
    "AccumguardError": "accumguard.core.errors",
    "AccumguardWarning": "accumguard.core.errors",
    "AccumulationError": "accumguard.core.errors",
    "ConfigError": "accumguard.core.errors",
    "DistributedError": "accumguard.core.errors",
    "RankFailedError": "accumguard.core.errors",
    "RankTimeoutError": "accumguard.core.errors",
    "UsageError": "accumguard.core.errors",
    "Boundary": "accumguard.core.boundary",
    "GradReduction": "accumguard.core.scaling",
    "loss_scale": "accumguard.core.scaling",
    "AccumulationConfig": "accumguard.accumulate.accumulator",
    "Accumulator": "accumguard.accumulate.accumulator",
    "StepResult": "accumguard.accumulate.accumulator",
    "Window": "accumguard.accumulate.accumulator",
    "Engine": "accumguard.engines.base",
    "resolve_engine": "accumguard.engines.registry",
    "AccumulationGuard": "accumguard.runtime.guard",
    "guard": "accumguard.runtime.guard",
    "run_on_ranks": "accumguard.runtime.launch",
    "reference_run": "accumguard.verify.reference",
    "relative_update_error": "accumguard.verify.reference",
    "audit": "accumguard.verify.audit",
    "run_invariance": "accumguard.invariance",
    "InvarianceOptions": "accumguard.invariance",
    "WatchResult": "accumguard.watch",
    "lint_paths": "accumguard.static.lint",
}

__all__ = [
    "AccumguardError",
    "AccumguardWarning",
    "AccumulationConfig",
    "AccumulationError",
    "AccumulationGuard",
    "Accumulator",
    "Boundary",
    "ConfigError",
    "DistributedError",
    "Engine",
    "GradReduction",
    "InvarianceOptions",
    "RankFailedError",
    "RankTimeoutError",
    "StepResult",
    "UsageError",
    "WatchResult",
    "Window",
    "audit",
    "guard",
    "invariance",
    "lint_paths",
    "loss_scale",
    "reference_run",
    "relative_update_error",
    "resolve_engine",
    "run_invariance",
    "run_on_ranks",
    "watch",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from accumguard import invariance
    from accumguard.accumulate.accumulator import (
        AccumulationConfig,
        Accumulator,
        StepResult,
        Window,
    )
    from accumguard.core.boundary import Boundary
    from accumguard.core.errors import (
        AccumguardError,
        AccumguardWarning,
        AccumulationError,
        ConfigError,
        DistributedError,
        RankFailedError,
        RankTimeoutError,
        UsageError,
    )
    from accumguard.core.scaling import GradReduction, loss_scale
    from accumguard.engines.base import Engine
    from accumguard.engines.registry import resolve_engine
    from accumguard.invariance import InvarianceOptions, run_invariance
    from accumguard.runtime.guard import AccumulationGuard, guard
    from accumguard.runtime.launch import run_on_ranks
    from accumguard.static.lint import lint_paths
    from accumguard.verify.audit import audit
    from accumguard.verify.reference import reference_run, relative_update_error
    from accumguard.watch import WatchResult
    from accumguard.watch import _Face as _WatchFace

    watch: _WatchFace


_moved.install()


def __getattr__(name: str) -> Any:
    if name == "__version__":
        try:
            from importlib.metadata import version

            return version("accumguard")
        except Exception:  # noqa: BLE001 - running from a source tree that is not installed
            return "0+unknown"
    if name in _PACKAGES:
        # importing the package also sets it as this module's attribute
        return importlib.import_module(f"accumguard.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accumguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
