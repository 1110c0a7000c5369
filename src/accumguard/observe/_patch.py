"""Reversible patches: every wrapper keeps the wrapped function's signature and goes away.

Libraries inspect what they call (Accelerate checks ``zero_grad`` for ``set_to_none``),
so each wrapper is made with :func:`functools.wraps`. :meth:`Patches.undo` puts back the
exact previous attribute (also when it was itself a wrapper) in reverse order.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accumguard.observe._failsafe import Failsafe, Maker

__all__ = ["Patches"]

_MISSING = object()


class Patches:
    """A stack of attribute replacements and hook handles, removed together.

    With a :class:`~accumguard.observe._failsafe.Failsafe`, every wrapper goes behind its
    patch door: an internal error in the wrapper never reaches the caller.
    """

    def __init__(self, failsafe: Failsafe | None = None) -> None:
        self._undo: list[Callable[[], None]] = []
        self.failsafe = failsafe

    def wrap(self, owner: object, attr: str, make: Maker) -> bool:
        """Replace ``owner.attr`` by ``make(original)`` (signature kept); False if absent.

        On a class the attribute is looked up in the class ``__dict__`` first, so a
        method inherited from a base class is shadowed on ``owner`` only and the undo
        deletes the shadow instead of copying the base method down.
        """
        if isinstance(owner, type):
            own = owner.__dict__.get(attr, _MISSING)
        else:
            own = vars(owner).get(attr, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        current = getattr(owner, attr, None)
        if current is None or not callable(current):
            return False
        raw = own if own is not _MISSING else current
        if isinstance(raw, (staticmethod, classmethod)):
            return False
        if self.failsafe is not None:
            label = f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}"
            wrapper = self.failsafe.patch(label, make, current)
        else:
            wrapper = make(current)
        with contextlib.suppress(AttributeError, TypeError):
            functools.update_wrapper(wrapper, current)
        setattr(owner, attr, wrapper)

        def undo() -> None:
            if own is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, attr)
            else:
                setattr(owner, attr, own)

        self._undo.append(undo)
        return True

    def wrap_member(self, module: object, cls_name: str, attr: str, make: Maker) -> bool:
        """:meth:`wrap` on ``module.cls_name`` (a library class, patched when its module is
        imported); False if the module has no such class (another version) or no ``attr``."""
        cls = getattr(module, cls_name, None)
        return cls is not None and self.wrap(cls, attr, make)

    def add(self, undo: Callable[[], None]) -> None:
        """Register any other undo action (a hook handle's ``remove``)."""
        self._undo.append(undo)

    def undo(self) -> None:
        """Undo everything, newest first; one failing undo does not stop the others."""
        while self._undo:
            action = self._undo.pop()
            with contextlib.suppress(Exception):
                action()

    def __len__(self) -> int:
        return len(self._undo)
