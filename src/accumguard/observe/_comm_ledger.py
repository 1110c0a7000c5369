"""The collective ledger: every gradient and parameter collective of a window, with its
operation, its bytes and where in the window it ran.

Two sources feed it:

* the collectives issued from Python (``torch.distributed``, ``deepspeed.comm``: FSDP2's
  reduce-scatters and all-gathers, DeepSpeed's reductions and gathers, hand-written ones),
  reported by :class:`~._collectives.CollectiveCounter` after each outermost call returns,
  with its arguments (the bytes) and the seconds spent inside it;
* DDP's bucket all-reduces, which its C++ reducer issues without passing through Python.
  DDP launches them exactly when the forward ran with gradients enabled and
  ``require_backward_grad_sync`` set (``_post_forward`` then calls the reducer's
  ``prepare_for_backward``; without it the reducer's autograd hooks return at once), one
  per bucket, each the bucket's whole buffer. The ledger books them at every backward whose
  forward saw the flag set (the flag the observer reads at the forward), with the bucket
  sizes DDP itself reports (``_get_ddp_logging_data``: ``bucket_sizes``, after the rebuild
  ``rebuilt_bucket_sizes``). No DDP communication hook is registered for this: a hook
  changes how the reducer divides (it stops pre-dividing the bucket, the hook must divide:
  another rounding when the world size is not a power of two) and DDP accepts one hook,
  once, before the first backward, so a script registering its own would fail. Their
  seconds are not measurable from Python (they overlap the backward): ``None``.

One more fact is kept for hand-written reductions inside a backward (a parameter's
post-accumulate-grad hook): a SUM all-reduce of a parameter's ``.grad`` that the same window
already SUM-reduced at an earlier micro-step (the same tensor object, held by a weak
reference): the running total, already equal on every rank, summed over the ranks again
(``resummed``: those micro-steps). A reduction of each micro-step's own gradient (a tensor
hook's argument) or of a buffer the script copies into is another tensor: never counted.

Per window the rows are aggregated by (operation, micro-step, inside a backward), so a
model with many FSDP groups costs a handful of rows per step, not one per call. The rows
belong to one optimizer step (the observer's count, in each call's position): the first
call of a later step starts them afresh, so a reader that takes only some windows (the
framework callbacks' checked steps) never gets several windows summed.
"""

from __future__ import annotations

import contextlib
import re
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from accumguard.observe._collectives import DDP_BUCKET_OP, Position
from accumguard.observe._failsafe import hook_method

if TYPE_CHECKING:
    from accumguard.observe._collectives import CollectiveCounter
    from accumguard.observe._events import BackwardEvent
    from accumguard.observe._failsafe import Failsafe

__all__ = ["DDP_BUCKET_OP", "CommLedger", "payload_bytes"]

def _is_sum(op: object) -> bool:
    """Whether a ``ReduceOp`` argument is SUM (an op that cannot be compared: no)."""
    import torch.distributed as dist

    try:
        return bool(op == dist.ReduceOp.SUM)
    except Exception:  # noqa: BLE001 - a custom op object: not a plain SUM
        return False


def payload_bytes(args: tuple[object, ...], kwargs: dict[str, object]) -> int:
    """The bytes a collective covers: the largest tensor (or tensor list, summed) among
    its arguments, i.e. the full buffer of an all-reduce, the input of a reduce-scatter,
    the output of an all-gather (the shard is the smaller one)."""
    best = 0
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            n = a.numel() * a.element_size()
        elif isinstance(a, (list, tuple)):
            n = sum(t.numel() * t.element_size() for t in a if isinstance(t, torch.Tensor))
        else:
            continue
        best = max(best, n)
    return best


class LedgerHost(Protocol):
    """What the ledger reads of the observer: its door, its collective counter, the DDP
    root whose forward ran last, and its quiet section (the ledger's own DDP query)."""

    failsafe: Failsafe
    counter: CollectiveCounter
    _sync_root: torch.nn.Module | None
    _tracked: list[torch.Tensor]

    def _quiet(self) -> contextlib.AbstractContextManager[None]: ...


@dataclass
class _Row:
    calls: int = 0
    nbytes: int = 0
    seconds: float | None = 0.0  # None: DDP's C++ reductions (not timed)


class CommLedger:
    """Listener and counter callback that books one window's collectives (see the module).

    Args:
        observer: the :class:`~._observer.Observer` whose counter and DDP root it reads.
    """

    def __init__(self, observer: LedgerHost) -> None:
        self.observer = observer
        self.failsafe = observer.failsafe  # the door of both callbacks (hook_method)
        # (op, micro, inside a backward) -> its calls, bytes and seconds
        self._rows: dict[tuple[str, int, bool], _Row] = {}
        self._t0 = time.perf_counter()
        self._buckets: dict[tuple[int, bool], list[int]] = {}
        self._static = False  # the DDP root was built with static_graph=True
        self._step: int | None = None  # the optimizer step the rows belong to
        # id(.grad) -> (weak reference, micro-step of its first SUM inside a backward)
        self._summed: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        # ((step, micro), ids of the tracked parameters' .grad tensors there)
        self._grad_ids: tuple[tuple[int | None, int] | None, set[int]] = (None, set())
        self._resummed: set[int] = set()  # micro-steps that summed a summed .grad again

    def _window(self, step: int | None) -> None:
        """Rows of an earlier step (a window nobody took) are dropped."""
        if step is not None and step != self._step:
            if self._step is not None:
                self._rows = {}
                self._fresh_sums()
            self._step = step

    def _fresh_sums(self) -> None:
        self._summed = {}
        self._grad_ids = (None, set())
        self._resummed = set()

    def attach(self) -> None:
        """Be told of every Python-level collective of the observer's counter."""
        self.observer.counter.ledger = self._ledger_collective

    @hook_method
    def _ledger_collective(self, op: str, args: tuple[object, ...], kwargs: dict[str, object],
                           pos: Position, seconds: float) -> None:
        """One outermost collective call (the counter's callback, behind its patch door)."""
        self._window(pos[0] if pos else None)
        micro = int(pos[1]) if len(pos) > 1 and pos[1] is not None else 0
        in_bw = bool(pos[2]) if len(pos) > 2 else False
        row = self._rows.setdefault((op, micro, in_bw), _Row())
        row.calls += 1
        row.nbytes += payload_bytes(args, kwargs)
        if row.seconds is not None:
            row.seconds += seconds
        if in_bw and op == "all_reduce":
            self._note_sum(args, kwargs, micro)

    def _note_sum(self, args: tuple[object, ...], kwargs: dict[str, object], micro: int) -> None:
        """A SUM all-reduce inside backward ``micro``: if its tensor is a tracked parameter's
        ``.grad``, remember it; if this window summed that very tensor at an earlier micro-step,
        note ``micro`` as one that summed the running total again (see the module)."""
        t = args[0] if args else kwargs.get("tensor")
        op = args[1] if len(args) > 1 else kwargs.get("op")
        if not isinstance(t, torch.Tensor) or (op is not None and not _is_sum(op)):
            return
        at, ids = self._grad_ids
        if at != (self._step, micro):  # the parameters' .grad tensors, once per micro-step
            ids = {id(g) for p in self.observer._tracked if (g := p.grad) is not None}
            self._grad_ids = ((self._step, micro), ids)
        if id(t) not in ids:
            return
        seen = self._summed.get(id(t))
        if seen is not None and seen[0]() is t:
            if seen[1] < micro:
                self._resummed.add(micro)
            return
        self._summed[id(t)] = (weakref.ref(t), micro)

    def on_backward(self, ev: BackwardEvent) -> None:
        # only a DDP backward whose forward synced books anything: the others skip the door
        # (the test is _ledger_ddp's own first line; this listener runs at every backward)
        if ev.engine == "ddp" and ev.sync_forward is True:
            self._ledger_ddp(ev)

    @hook_method
    def _ledger_ddp(self, ev: BackwardEvent) -> None:
        """A backward whose DDP forward ran with sync on: DDP's reducer all-reduced every
        bucket inside it (see the module)."""
        if ev.engine != "ddp" or ev.sync_forward is not True:
            return
        root = self.observer._sync_root
        sizes = self.ddp_buckets(root)
        if not sizes:
            return
        self._window(ev.step)
        self._static = self._static or bool(getattr(root, "static_graph", False))
        row = self._rows.setdefault((DDP_BUCKET_OP, int(ev.micro), True), _Row(seconds=None))
        row.calls += len(sizes)
        row.nbytes += sum(sizes)

    def ddp_buckets(self, module: torch.nn.Module | None) -> list[int]:
        """Bucket sizes in bytes of a DDP module as its reducer reports them; empty for a
        DDP whose reductions go through Python (compiled DDP's Python reducer, all
        parameters delayed): those are counted where they are issued."""
        if module is None or not hasattr(module, "_get_ddp_logging_data"):
            return []
        if getattr(module, "_use_python_reducer", False) or getattr(
                module, "_delay_all_reduce_all_params", False):
            return []
        key = (id(module), bool(getattr(module, "_has_rebuilt_buckets", False)))
        sizes = self._buckets.get(key)
        if sizes is None:
            with self.observer._quiet():
                data = getattr(module, "_get_ddp_logging_data")()  # noqa: B009 - DDP's own
            text = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
            sizes = self._buckets[key] = [int(x) for x in re.findall(r"\d+", text)]
        return sizes

    def take(self, step: int | None = None) -> dict[str, object]:
        """The window's ledger for its step record, and a fresh one for the next window
        (``step``: the optimizer step asked for; rows of another step are not its own):
        ``rows``: ``[op, micro, in_backward, calls, bytes, seconds]`` (``micro``: backward
        passes completed before the call, or the one it ran inside; ``seconds``: time
        inside the call, None for DDP's C++ reductions); ``window_s``: the window's wall
        time, previous step's end to this step's end."""
        now = time.perf_counter()
        rows = [[op, micro, in_bw, r.calls, r.nbytes,
                 None if r.seconds is None else round(r.seconds, 6)]
                for (op, micro, in_bw), r in self._rows.items()
                if step is None or self._step is None or step == self._step]
        out: dict[str, object] = {"rows": rows, "window_s": round(now - self._t0, 6)}
        if self._static:
            out["ddp_static_graph"] = True
        if self._resummed:
            out["resummed"] = sorted(self._resummed)
            self._resummed = set()
        if self._summed:  # (reset in line: this runs at every step)
            self._summed = {}
        self._rows = {}
        self._t0 = now
        return out
