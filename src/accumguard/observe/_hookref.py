"""The hooks accumguard puts on a user's modules, safe to copy and to pickle with them.

torch keeps a module's hooks in the module's own dicts, so ``copy.deepcopy(model)`` (an EMA
or teacher copy made after the first forward) and ``torch.save(model)`` (the whole module
pickled) take them along. A bound method of the observer would drag the observer with it,
and the observer holds a thread-local: the user's copy or save raised (blind round 27,
c_c02: ``deepcopy`` of a policy for its EMA). Every module hook therefore goes through
:class:`ModuleHook`: a copied module gets an inert hook (the observer treats the copy as
any module it has not hooked: before the roots are pinned the global hook sees it), and a
pickled one a standard-library no-op (``logging``'s ``debug`` of a logger that nothing
enables), so nothing of accumguard is needed to load the file.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["ModuleHook"]

#: the logger whose ``debug`` stands in for a hook in a pickled module (returns None)
UNPICKLED = "accumguard.unpickled_hook"


def _inert(*args: Any, **kwargs: Any) -> None:
    """What a copied module's hook calls: nothing."""


class ModuleHook(functools.partial[Any]):
    """``fn`` as a module hook (forward pre or post), inert in a copy, a no-op when pickled.

    A :class:`functools.partial` with no bound arguments: calling it adds no Python frame
    to the hot path (a hook runs at every forward)."""

    __slots__ = ()

    def __new__(cls, fn: Callable[..., Any]) -> ModuleHook:
        return super().__new__(cls, fn)

    @property
    def inert(self) -> bool:
        """This is a copied module's hook: it does nothing."""
        return self.func is _inert

    def __deepcopy__(self, memo: dict[int, Any]) -> ModuleHook:
        return ModuleHook(_inert)

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (logging.getLogger(UNPICKLED), "debug"))
