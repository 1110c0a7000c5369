"""Run a callback right after a module is imported (or now, if it already is).

The observer patches library classes (DeepSpeed's engine, Accelerate's objects,
torch's clipping functions) before user code imports names from them, without
importing those libraries itself: importing torch or DeepSpeed early would change
the user's process (environment variables read at import, start-up time).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]

_lock = threading.RLock()
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}
_finder: _PostImportFinder | None = None


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a watched module."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        real_exec = loader.exec_module

        def exec_module(module: ModuleType, _real: Any = real_exec) -> None:
            _real(module)
            _fire(fullname, module)

        try:
            loader.exec_module = exec_module  # type: ignore[method-assign]
        except (AttributeError, TypeError):
            return spec
        return spec


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _pending.pop(name, [])
    for cb in callbacks:
        try:
            cb(module)
        except Exception as exc:  # noqa: BLE001 - never break the user's import
            print(f"accumguard: could not observe {name}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` is imported (immediately if it is)."""
    global _finder
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing",
                                      False) is False:
        callback(module)
        return
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if _finder is None:
            _finder = _PostImportFinder()
            sys.meta_path.insert(0, _finder)
