"""Module hooks taken off for a block and put back in order: the idle micro-steps of a window
whose parameters stay gathered (DeepSpeed ZeRO-3, ``_deepspeed_window``) or unsharded (FSDP2,
``_fsdp2_window``) run without the engine's per-module hooks, which would do nothing there
but cost a call each. One place for the put-back rule, which both rely on for bit-identity."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

__all__ = ["hooks_off"]


@contextlib.contextmanager
def hooks_off(handles: Iterable[Any]) -> Iterator[None]:
    """Remove the hooks of ``handles`` (``RemovableHandle``\\ s: ``hooks_dict_ref()`` and ``id``)
    from their modules' hook dictionaries for the block, then put them back at their own
    places, whatever happens in the block. Hooks the block added stay, after them; hooks it
    removed stay removed."""
    saved: list[tuple[MutableMapping[int, Any], list[tuple[int, Any]], set[int]]] = []
    by_dict: dict[int, tuple[MutableMapping[int, Any], set[int]]] = {}
    for h in handles:
        hooks = h.hooks_dict_ref()
        if hooks is not None and h.id in hooks:
            by_dict.setdefault(id(hooks), (hooks, set()))[1].add(h.id)
    try:
        for hooks, ids in by_dict.values():
            saved.append((hooks, list(hooks.items()), ids))
            for key in ids:
                del hooks[key]
        yield
    finally:
        for hooks, before, ids in saved:
            now = dict(hooks)  # hooks the block added or removed meanwhile stay so
            hooks.clear()
            for key, fn in before:
                if key in ids:
                    hooks[key] = fn
                elif key in now:
                    hooks[key] = now[key]
            for key, fn in now.items():
                if key not in hooks:
                    hooks[key] = fn
