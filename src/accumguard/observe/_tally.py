"""Counts per live object (optimizer steps, scheduler steps).

Keyed by ``id()`` alone, a count outlives its object: a scheduler rebuilt to resume from a
checkpoint often gets the freed one's address, and inherited its step count (a correct
resumed run read as F4). Here an entry holds a weak reference to its object, and an id now
worn by another object starts again from zero. Nothing is stored on the user's objects
(a scheduler's ``state_dict`` is its ``__dict__``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

__all__ = ["Tally"]


class Tally:
    """``add(obj)`` counts one more for ``obj``; ``get(obj, default)`` reads it."""

    def __init__(self) -> None:
        self._d: dict[int, tuple[Callable[[], object], int]] = {}

    def get(self, obj: object, default: int = 0) -> int:
        entry = self._d.get(id(obj))
        if entry is None or entry[0]() is not obj:
            return default
        return entry[1]

    def add(self, obj: object) -> int:
        entry = self._d.get(id(obj))  # get() inlined (called at every step)
        return self.set(obj, 1 if entry is None or entry[0]() is not obj else entry[1] + 1)

    def items(self) -> list[tuple[object, int]]:
        """The live objects and their counts."""
        out = []
        for ref, n in self._d.values():
            obj = ref()
            if obj is not None:
                out.append((obj, n))
        return out

    def set(self, obj: object, n: int) -> int:
        """Store ``n`` for ``obj`` (returns it)."""
        ref: Callable[[], object]
        try:
            ref = weakref.ref(obj)
        except TypeError:  # not weak-referenceable: compared by identity while it lives
            ref = _Strong(obj)
        self._d[id(obj)] = (ref, n)
        return n


class _Strong:
    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __call__(self) -> object:
        return self.obj
