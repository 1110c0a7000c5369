"""The coalesced reduction without DeepSpeed's redundant gradient copies (``lean_flush``).

ZeRO-1/2: the contiguous reduce bucket is all-reduced in place (below). ZeRO-3: the flush
leaves every gradient in its own tensor instead of first copying it into the contiguous
bucket: with ``reduce_scatter`` on (the default) DeepSpeed's ``reduce_scatter_coalesced``
interleaves the rank partitions into a new tensor (``torch.cat``) whichever way the
gradients arrive, so the bucket copy is a second copy of every gradient. The flush runs
with the optimizer's ``contiguous_gradients`` off (DeepSpeed's own code path for that
setting); the buckets, their order (sorted by parameter id) and so the numbers are the
same, and the original gradient tensors are not freed one by one into the bucket, so the
flush's peak memory does not grow. Backwards inside the window are untouched (the coalesced
block reduces nothing until it closes).

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

The step (ZeRO-1/2): ``step()`` flattens this rank's gradient partition, views laid end to
end in the contiguous partition buffer the flush filled, into a new tensor for the
optimizer. :meth:`LeanFlush.stepping` serves that as a view of the buffer: the optimizer
reads the same numbers; DeepSpeed frees the parameters' gradients before it scales the flat
one in place (clipping), and the buffer is refilled only by the next flush.

ZeRO-3 on gloo with 2 ranks: DeepSpeed's ``reduce_scatter_coalesced`` reduce-scatters the
interleaved buffer in place (this rank's output is a view of its chunk of the input), and
gloo's reduce-scatter of a tensor costs about twice the CPU time of its all-reduce of the
same tensor, and its all-reduce twice an exchange of halves (docs/dev/performance-journal.md).
During the flush that call is served by :func:`accumguard.engines._pair.reduce_scatter_pair`:
this rank sends the peer's chunk, receives the peer's copy of its own chunk and adds it in
place. With two ranks each element is ``a + b`` of the same two numbers, which IEEE 754
rounds identically in either order, so the chunk holds the same bits; the other rank's
chunk keeps this rank's share, as after gloo's own reduce-scatter. Another group size, op
or layout goes to DeepSpeed's own call (``pair_reductions`` counts the exchanges).

ZeRO-1/2 on CPU, the reduce bucket kept between flushes: every flush, DeepSpeed allocates
the contiguous bucket afresh (``setup_buckets``: ``reduce_bucket_size`` elements, 2 GB of
fp32 with its default 5e8) and frees it when the flush ends (``_release_ipg_buffers``). On
the GPU the caching allocator hands the same block back; on the CPU an allocation that
large is a fresh memory mapping, so copying the window's gradients into it page-faults
every page it touches and freeing it unmaps them again: 12-15 ms of CPU time per flush for
25 MB of gradients (docs/dev/performance-journal.md), about a third of the flush. There the
flush keeps the bucket tensor when DeepSpeed lets it go and gives it back at the next
flush instead of a new allocation (``setup_buckets`` runs with ``contiguous_gradients`` off
for that call, so it allocates nothing and does the rest of its work as usual). The
bucket's contents are never read before they are written (each gradient is copied to its
own range from offset 0, and only ``[0, elements)`` is reduced), so the numbers are the
same. It is kept only when nothing else references its memory (the storage's use count:
no gradient, and no tensor a user kept, is a view of it; otherwise DeepSpeed allocates as
before), on the CPU only, without ``overlap_comm`` or CPU offload. Memory: the pages the
flush touched (the window's gradients in the bucket's dtype, at most
``reduce_bucket_size`` elements) stay resident between flushes instead of being returned to
the system; the flush's own peak does not change. ``close()`` of the adapter lets it go;
``DeepSpeedEngineAdapter(..., keep_reduce_bucket=False)`` turns it off.

Applied only to all-reduces (``rank=None``; a ``reduce`` to one rank leaves the other
ranks' inputs undefined, which the copy protected) and only without ``overlap_comm`` (its
separate reduction stream and double-buffered bucket were not measured).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from accumguard.engines import _pair

__all__ = ["LeanFlush", "adjacent_view"]


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


class LeanFlush:
    """Patches one DeepSpeed ZeRO optimizer for the duration of a coalesced flush (see the
    module docstring). ``in_place`` counts the copies avoided (ZeRO-1/2: bucket flattens
    served as a view; ZeRO-3: flushes without the bucket copy), ``copied`` the flattens left
    to DeepSpeed (the tests read both: the fast path must really be taken)."""

    def __init__(self, optimizer: Any, stage: int, *, keep_bucket: bool = True) -> None:
        self.optimizer = optimizer
        self.stage = stage
        self.in_place = 0
        self.copied = 0
        self.step_views = 0  # step() flattens served as a view (ZeRO-1/2)
        self.pair_reductions = 0  # ZeRO-3 reduce-scatters served by an exchange (2 ranks)
        self.keep_bucket = keep_bucket
        self.buckets_reused = 0  # ZeRO-1/2 flushes that reused the kept CPU bucket
        # ZeRO-1/2 on CPU: the reduce buckets DeepSpeed released at the end of the last flush
        # (communication dtype -> the bucket tensor), given back at the next one.
        self._kept: dict[Any, torch.Tensor] = {}
        inner = getattr(optimizer, "optimizer", None)
        # The step's flatten feeds a plain torch optimizer only (no CPU offload, whose step
        # reads its own buffers, and not Muon, whose step flattens and writes other lists).
        self._step_views = (stage in (1, 2) and not getattr(optimizer, "cpu_offload", False)
                            and isinstance(inner, torch.optim.Optimizer)
                            and "muon" not in type(inner).__name__.lower())

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """Around ``engine.step()``: the gradient partition's flatten served as a view of the
        contiguous partition buffer when its pieces lie end to end there (module docstring)."""
        if not self._step_views:
            yield
            return
        opt = self.optimizer
        real_flatten: Callable[[list[torch.Tensor]], torch.Tensor] = opt.flatten

        def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
            view = adjacent_view(tensors)
            if view is None:
                return real_flatten(tensors)
            self.step_views += 1
            return view

        opt.flatten = flatten
        try:
            yield
        finally:
            opt.flatten = real_flatten

    @staticmethod
    def unsupported(optimizer: Any, stage: int) -> str:
        """Why the lean flush does not apply to this optimizer ("" when it does)."""
        if stage == 3:
            if not isinstance(getattr(optimizer, "contiguous_gradients", None), bool):
                return (f"{type(optimizer).__name__} has no contiguous_gradients flag "
                        "(DeepSpeed 0.19.8's ZeRO-3 optimizer has one)")
            if getattr(optimizer, "reduce_scatter", None) is not True:
                return ("reduce_scatter is off (the contiguous bucket is then all-reduced "
                        "as it is, no second copy to avoid)")
            return ""
        if not callable(getattr(optimizer, "flatten", None)) or \
                not callable(getattr(optimizer, "allreduce_bucket", None)):
            return (f"{type(optimizer).__name__} has no flatten/allreduce_bucket (DeepSpeed "
                    "0.19.8's ZeRO-1/2 optimizer has both)")
        if getattr(optimizer, "overlap_comm", False):
            return "overlap_comm is on (its reduction stream was not measured with it)"
        return ""

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """For the flush: ZeRO-3, ``contiguous_gradients`` off; ZeRO-1/2, ``flatten`` served
        as a view inside ``allreduce_bucket(rank=None)`` calls. Everything is put back
        afterwards, whatever happens."""
        if self.stage == 3:
            with self._no_bucket_copy():
                yield
            return
        with self._all_reduce_in_place(), self._bucket_kept():
            yield

    def release(self) -> None:
        """Let the kept reduce bucket go (the adapter's ``close()``)."""
        self._kept = {}

    def _keeps_buckets(self) -> bool:
        opt = self.optimizer
        return (self.keep_bucket and self.stage in (1, 2) and getattr(opt, "contiguous_gradients", None) is True
                and not getattr(opt, "overlap_comm", False)
                and not getattr(opt, "cpu_offload", False)
                and isinstance(getattr(opt, "ipg_buckets", None), dict)
                and callable(getattr(opt, "setup_buckets", None))
                and callable(getattr(opt, "_release_ipg_buffers", None))
                and callable(getattr(torch._C, "_storage_Use_Count", None)))

    def _reusable(self, kept: dict[Any, torch.Tensor]) -> bool:
        """The kept buckets can stand in for DeepSpeed's new ones: the same communication
        dtypes, size, dtype and CPU device DeepSpeed would allocate now, the buckets empty,
        and no other tensor referencing their memory."""
        opt = self.optimizer
        try:
            buckets = opt.ipg_buckets
            if not kept or opt.ready_for_gradients is not False or set(kept) != set(buckets):
                return False
            size = int(opt.reduce_bucket_size)
            dtype = opt._gradient_reduction_buffer_dtype()
            for key, buf in kept.items():
                bucket = buckets[key]
                if (len(bucket.buffer) or bucket.elements or buf.numel() != size
                        or buf.dtype != dtype or buf.device.type != "cpu"
                        # our tensor + the storage object made for the count: nothing else
                        or torch._C._storage_Use_Count(buf.untyped_storage()._cdata) != 2):
                    return False
        except (AttributeError, TypeError, ValueError, RuntimeError):
            return False  # not the DeepSpeed this was written for: allocate as it does
        return True

    @contextlib.contextmanager
    def _bucket_kept(self) -> Iterator[None]:
        """ZeRO-1/2 on CPU: DeepSpeed's reduce bucket kept from one flush to the next (module
        docstring)."""
        if not self._keeps_buckets():
            self._kept = {}
            yield
            return
        opt = self.optimizer
        had_setup, had_release = "setup_buckets" in vars(opt), "_release_ipg_buffers" in vars(opt)
        real_setup: Callable[[], None] = opt.setup_buckets
        real_release: Callable[[], None] = opt._release_ipg_buffers

        def setup_buckets() -> None:
            kept, self._kept = self._kept, {}
            if not self._reusable(kept):
                real_setup()
                return
            opt.contiguous_gradients = False  # setup_buckets then allocates nothing
            try:
                real_setup()
            finally:
                opt.contiguous_gradients = True
            for key, buf in kept.items():
                bucket = opt.ipg_buckets[key]
                bucket.buffer.append(buf)
                bucket.index = 0
            self.buckets_reused += 1

        def release_ipg_buffers() -> None:
            kept = {}
            try:
                for key, bucket in opt.ipg_buckets.items():
                    if len(bucket.buffer) == 1 and bucket.buffer[0].device.type == "cpu":
                        kept[key] = bucket.buffer[0]
            except (AttributeError, TypeError):
                kept = {}
            real_release()
            self._kept = kept if len(kept) == len(opt.ipg_buckets) else {}

        opt.setup_buckets = setup_buckets
        opt._release_ipg_buffers = release_ipg_buffers
        try:
            yield
        except BaseException:
            self._kept = {}
            raise
        finally:
            for name, had, real in (("setup_buckets", had_setup, real_setup),
                                    ("_release_ipg_buffers", had_release, real_release)):
                if had:
                    setattr(opt, name, real)
                else:
                    delattr(opt, name)

    @contextlib.contextmanager
    def _no_bucket_copy(self) -> Iterator[None]:
        opt = self.optimizer
        saved = opt.contiguous_gradients
        opt.contiguous_gradients = False
        try:
            with self._pair_all_reduce():
                yield
        finally:
            opt.contiguous_gradients = saved
        if saved:
            self.in_place += 1

    @contextlib.contextmanager
    def _pair_all_reduce(self) -> Iterator[None]:
        """ZeRO-3, gloo, 2 ranks: DeepSpeed's in-place reduce-scatter of the interleaved
        buffer as one exchange of halves (:mod:`accumguard.engines._pair`; module docstring)."""
        try:
            import deepspeed.comm as ds_dist
            from deepspeed.runtime.comm import coalesced_collectives as cc
        except ImportError:
            yield
            return
        real: Callable[..., Any] | None = getattr(cc, "_torch_reduce_scatter_fn", None)
        if real is None:
            yield
            return

        def reduce_scatter(input_tensor: torch.Tensor, output_tensor: torch.Tensor,
                           group: Any = None, async_op: bool = False, prof: bool = False,
                           ) -> Any:
            if not async_op and _own_half_of(input_tensor, output_tensor, group, ds_dist):
                half = output_tensor.numel()
                flat = input_tensor.view(-1)
                other = flat[half:] if output_tensor.data_ptr() == flat.data_ptr() else flat[:half]
                _pair.reduce_scatter_pair(output_tensor.view(-1), output_tensor.view(-1), other,
                                          group, whole=input_tensor)
                self.pair_reductions += 1
                return None
            return real(input_tensor, output_tensor, group=group, async_op=async_op,
                        prof=prof)

        cc._torch_reduce_scatter_fn = reduce_scatter
        try:
            yield
        finally:
            cc._torch_reduce_scatter_fn = real

    @contextlib.contextmanager
    def _all_reduce_in_place(self) -> Iterator[None]:
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


def _own_half_of(input_tensor: torch.Tensor, output_tensor: torch.Tensor, group: Any,
                 ds_dist: Any) -> bool:
    """gloo, a group of 2, CPU tensors, and ``output_tensor`` exactly this rank's half of
    ``input_tensor`` (contiguous, one storage, the same dtype). (Also asked, roles swapped,
    of an in-place all-gather: its input is this rank's half of its output.)"""
    import torch.distributed as dist

    try:
        if ds_dist.get_world_size(group) != 2 or dist.get_backend(group) != "gloo":
            return False
        rank = ds_dist.get_rank(group)
    except (RuntimeError, ValueError, AttributeError):
        return False
    half = output_tensor.numel()
    return (input_tensor.device.type == "cpu" and output_tensor.device.type == "cpu"
            and input_tensor.is_contiguous() and output_tensor.is_contiguous()
            and input_tensor.dtype == output_tensor.dtype and input_tensor.numel() == 2 * half
            and input_tensor.untyped_storage().data_ptr()
            == output_tensor.untyped_storage().data_ptr()
            and output_tensor.storage_offset() == input_tensor.storage_offset() + rank * half)
