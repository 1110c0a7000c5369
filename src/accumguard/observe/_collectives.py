"""Counting collectives where they are issued: ``torch.distributed`` and ``deepspeed.comm``.

This is the one place that knows which collective functions exist and which of them
reduce gradients. Only the outermost call counts (``deepspeed.comm`` calls
``torch.distributed``; ``reduce_scatter_fn`` calls ``reduce_scatter_tensor``), and calls
made by accumguard itself (:meth:`CollectiveCounter.paused`) are not counted.

DDP's bucket all-reduces are issued from C++ and never reach these functions; the
collective ledger (:mod:`._comm_ledger`) books them from DDP's sync flag at the forward
(the condition under which DDP's reducer launches them) and DDP's reported bucket sizes.

The counter also remembers, in memory only, the collective this process is inside
(:attr:`CollectiveCounter.open`), the last one it left (``last_done``) and the last one
that raised (``failed``): ``accumguard watch`` writes them when the process ends, so a
rank stuck in a collective its peer never entered is named with its position (no I/O
per call: a tuple per outermost call).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

from accumguard.engines.collectives import (
    DS_COMM_MODULES,
    DS_OTHER_OPS,
    DS_REDUCE_OPS,
    OWN_OTHER_OPS,
    OWN_REDUCE_OPS,
    TORCH_OTHER_OPS,
    TORCH_REDUCE_OPS,
)
from accumguard.observe._failsafe import Failsafe, Maker, Original
from accumguard.observe._patch import Patches

__all__ = ["DDP_BUCKET_OP", "CollectiveCounter", "DS_COMM_MODULES", "DS_REDUCE_OPS",
           "OWN_REDUCE_OPS", "TORCH_REDUCE_OPS"]

#: Where a collective was entered: (optimizer step, backwards so far in the window, inside a
#: backward); the step and count are None when the observer did not say.
Position = tuple[int | None, int | None, bool]
#: One outermost collective call: (op, its call number for that op, *Position)
Call = tuple[str, int, int | None, int | None, bool]
#: A call that raised: the Call and the error's text
Failed = tuple[str, int, int | None, int | None, bool, str]

#: The ledger's name for DDP's C++ bucket all-reduces (:mod:`._comm_ledger`).
DDP_BUCKET_OP = "all_reduce(ddp bucket)"


class CollectiveCounter:
    """Wraps the collective functions and calls ``on_call(op, reduces)`` per outermost call."""

    def __init__(self, on_call: Callable[[str, bool], None], *,
                 failsafe: Failsafe | None = None) -> None:
        self.on_call = on_call
        self._depth = 0
        self._paused = 0
        self._ds_done = False
        self.patches = Patches(failsafe)
        # the caller's position at entry, e.g. (optimizer step, backwards in window,
        # inside a backward); set by the observer
        self.position: Callable[[], tuple[int, int, bool]] | None = None
        self.calls: dict[str, int] = {}  # outermost calls per op name
        self.open: Call | None = None  # (op, call, step, micro, in_backward)
        self.last_done: Call | None = None
        self.failed: Failed | None = None  # the open call + (error text,)
        # the collective ledger (:mod:`._comm_ledger`): told of each outermost call after it
        # returned, with its arguments, its position and the seconds spent inside it
        self.ledger: Callable[[str, tuple[object, ...], dict[str, object], Position, float],
                              None] | None = None

    def state(self) -> dict[str, object]:
        """What :attr:`open`/``last_done``/``failed`` say, as JSON-ready dicts."""
        def one(t: Call | Failed | None) -> dict[str, object] | None:
            if t is None:
                return None
            d: dict[str, object] = {"op": t[0], "call": t[1], "step": t[2], "micro": t[3],
                                    "in_backward": t[4]}
            if len(t) > 5:
                d["error"] = t[5]
            return d

        return {"open": one(self.open), "last_done": one(self.last_done),
                "failed": one(self.failed), "calls": dict(self.calls)}

    def install_torch(self) -> None:
        import torch.distributed as dist

        for op in TORCH_REDUCE_OPS + TORCH_OTHER_OPS:
            if hasattr(dist, op):
                self.patches.wrap(dist, op, self._counting(op, op in TORCH_REDUCE_OPS))
        # accumguard's own 2-rank reduce-scatter (point-to-point sends, seen by no function above)
        import accumguard.engines._pair as pair

        for op in OWN_REDUCE_OPS + OWN_OTHER_OPS:
            self.patches.wrap(pair, op, self._counting(op, op in OWN_REDUCE_OPS))

    def install_deepspeed(self) -> None:
        """Wrap ``deepspeed.comm`` (call again once it is imported; idempotent)."""
        if self._ds_done or "deepspeed.comm.comm" not in sys.modules:
            return
        self._ds_done = True
        for name in DS_COMM_MODULES:
            mod = sys.modules.get(name)
            if mod is None:
                continue
            for op in DS_REDUCE_OPS + DS_OTHER_OPS:
                if callable(getattr(mod, op, None)):
                    self.patches.wrap(mod, op, self._counting(op, op in DS_REDUCE_OPS))

    def uninstall(self) -> None:
        self.patches.undo()
        self._ds_done = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Collectives issued inside are accumguard's own: not counted."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _counting(self, op: str, reduces: bool) -> Maker:
        def make(orig: Original) -> Original:
            def call(*args: object, **kwargs: object) -> object:
                if self._depth or self._paused:
                    return orig(*args, **kwargs)
                self._depth += 1
                n = self.calls[op] = self.calls.get(op, 0) + 1
                pos: Position = (self.position() if self.position is not None
                                 else (None, None, False))
                here = self.open = (op, n, *pos)
                try:
                    self.on_call(op, reduces)
                    t0 = time.perf_counter()
                    out = orig(*args, **kwargs)
                    took = time.perf_counter() - t0
                except BaseException as exc:
                    # stays open: the rank never left this collective normally
                    self.failed = (*here, f"{type(exc).__name__}: {str(exc)[:300]}")
                    raise
                finally:
                    self._depth -= 1
                self.last_done = here
                self.open = None
                if self.ledger is not None:
                    self.ledger(op, args, kwargs, pos, took)
                return out

            return call

        return make
