"""The coalesced ZeRO-1/2 reduction without DeepSpeed's flatten copy (``reduce_in_place``).

Where the time of a coalesced ZeRO-2 window goes beyond the limit (DeepSpeed 0.19.8, default
``contiguous_gradients: true``, measured on CPU, docs/dev/performance-journal.md): leaving
``engine.coalesce_grad_reduction()`` copies every gradient into the contiguous reduce bucket,
then ``allreduce_bucket`` flattens that bucket's per-rank slices into a **new** tensor (one
copy of every gradient), all-reduces it and copies the result back into the bucket. The
slices are already adjacent views of the bucket, in order, so the flattened tensor holds
exactly the bytes of the bucket range they cover: all-reducing that range in place gives
the same numbers with no copy out and, since the result is then already where DeepSpeed
copies it to, no copy back (``Tensor.copy_`` onto the very same memory returns at once).

What changes besides the copies: the bucket slices that belong to the *other* ranks'
partitions now hold the reduced sum instead of this rank's local share. DeepSpeed never
reads them (ZeRO-2 drops those gradients right after the reduction; ZeRO-1 frees them at
the step; the step reads only this rank's partition), and the all-reduce sums the very
same values, so the update is bit-identical (tested against the flatten path).

Applied only to all-reduces (``rank=None``; a ``reduce`` to one rank leaves the other
ranks' inputs undefined, which the copy protected) and only without ``overlap_comm`` (its
separate reduction stream and double-buffered bucket were not measured).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["InPlaceFlush", "adjacent_view"]


def adjacent_view(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One 1-D view over ``tensors`` when they are contiguous, of one dtype, and lie end to
    end in one storage, in list order (exactly the bytes ``torch.cat`` would copy); else
    None."""
    if not tensors:
        return None
    first = tensors[0]
    try:
        storage = first.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, fake)
        return None
    offset = first.storage_offset()
    total = 0
    for t in tensors:
        if (not t.is_contiguous() or t.dtype != first.dtype or t.device != first.device
                or t.untyped_storage().data_ptr() != storage
                or t.storage_offset() != offset + total):
            return None
        total += t.numel()
    return first.as_strided((total,), (1,), offset)


class InPlaceFlush:
    """Patches one DeepSpeed ZeRO-1/2 optimizer for the duration of a coalesced flush (see
    the module docstring). ``in_place`` / ``copied`` count the bucket flattens served as a
    view / left to DeepSpeed (the tests read them: the fast path must really be taken)."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.in_place = 0
        self.copied = 0

    @staticmethod
    def unsupported(optimizer: Any) -> str:
        """Why the in-place flush does not apply to this optimizer ("" when it does)."""
        if not callable(getattr(optimizer, "flatten", None)) or \
                not callable(getattr(optimizer, "allreduce_bucket", None)):
            return (f"{type(optimizer).__name__} has no flatten/allreduce_bucket (DeepSpeed "
                    "0.19.8's ZeRO-1/2 optimizer has both)")
        if getattr(optimizer, "overlap_comm", False):
            return "overlap_comm is on (its reduction stream was not measured with it)"
        return ""

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Serve ``flatten`` as a view inside ``allreduce_bucket(rank=None)`` calls; restore
        both attributes afterwards, whatever happens."""
        opt = self.optimizer
        real_flatten: Callable[[list[torch.Tensor]], torch.Tensor] = opt.flatten
        had_bucket_attr = "allreduce_bucket" in vars(opt)
        real_bucket: Callable[..., torch.Tensor] = opt.allreduce_bucket
        all_reduce = [False]  # inside an allreduce_bucket call that all-reduces

        def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
            if all_reduce[0]:
                view = adjacent_view(tensors)
                if view is not None:
                    self.in_place += 1
                    return view
            self.copied += 1
            return real_flatten(tensors)

        def allreduce_bucket(bucket: list[torch.Tensor], *args: Any, **kwargs: Any,
                             ) -> torch.Tensor:
            rank = kwargs.get("rank", args[1] if len(args) > 1 else None)
            all_reduce[0] = rank is None
            try:
                return real_bucket(bucket, *args, **kwargs)
            finally:
                all_reduce[0] = False

        opt.flatten = flatten
        opt.allreduce_bucket = allreduce_bucket
        try:
            yield
        finally:
            opt.flatten = real_flatten
            if had_bucket_attr:
                opt.allreduce_bucket = real_bucket
            else:
                del opt.allreduce_bucket
