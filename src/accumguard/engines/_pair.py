"""A SUM reduce-scatter, and an in-place all-gather, between two gloo ranks as one exchange
of halves.

With two ranks, rank r's share of a reduce-scatter is its own half of the input plus the
peer's copy of that half: one send of the half the peer owns, one receive of the half this
rank owns, one add. Each rank sends and receives half the buffer, the bytes a ring
reduce-scatter moves. On gloo that is the cheapest form there is: CPU time per call, 25 MB,
2 ranks (docs/dev/performance-journal.md): ``reduce_scatter_tensor`` 31-32 ms,
``all_reduce`` of the whole buffer 15-16 ms, this exchange 6.4-6.6 ms.

Exact: each element of the result is ``a + b`` of the same two numbers, which IEEE 754
rounds identically in either order, so it holds the bits of gloo's reduce-scatter (and of
its all-reduce). The FSDP2 adapter (``pair_all_reduce``) and DeepSpeed's ZeRO-3 flush
(``lean_flush``) use it only on gloo, with a group of two, SUM, synchronous calls; never
on NCCL or any other backend.

The same exchange serves DeepSpeed ZeRO-3's in-place all-gather of the coalesced parameter
partitions (:func:`all_gather_pair`: send this rank's half, receive the peer's into its
place): gloo's ``all_gather_into_tensor`` of 25 MB costs 9-10 ms CPU, the exchange 6.6-7.2.
It moves bytes without arithmetic, so the result is the same whatever the order.

The observation layer wraps both (callers look them up on this module at call time), the
reduce-scatter as a gradient reduction, so the collective ledger books them like the
collectives they stand for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["PairWork", "all_gather_pair", "reduce_scatter_pair"]


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, b0 = a.storage_offset(), b.storage_offset()
    return a0 < b0 + b.numel() and b0 < a0 + a.numel()


def reduce_scatter_pair(out: torch.Tensor, own: torch.Tensor, other: torch.Tensor,
                        group: ProcessGroup | None, *, whole: torch.Tensor | None = None) -> None:
    """``out = own + peer's own``: send ``other`` (the half of this rank's input that the
    peer owns), receive the peer's half that this rank owns, add ``own`` (this rank's half
    of its input). All three contiguous, same dtype and size; ``out`` is either ``own``
    itself (an in-place reduce-scatter, DeepSpeed's) or memory of its own (FSDP2's).
    ``whole`` (the input both halves come from) is not read: the collective ledger sizes the
    call by its largest tensor argument, which is then the reduce-scatter's input."""
    peer = 1 - dist.get_rank(group)
    into = (torch.empty_like(own) if _overlaps(out, own) or _overlaps(out, other) else out)
    works = [dist.isend(other, group=group, group_dst=peer),
             dist.irecv(into, group=group, group_src=peer)]
    for work in works:
        if work is not None:
            work.wait()
    if into is out:
        out.add_(own)  # the peer's half + this rank's
        return
    if out.data_ptr() != own.data_ptr():
        out.copy_(own)
    out.add_(into)  # this rank's half + the peer's


class PairWork:
    """The pending sends and receives of :func:`all_gather_pair`; ``wait()`` as a ``Work``."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        works, self.works = self.works, []
        for work in works:
            if work is not None:
                work.wait()
        return True

    def is_completed(self) -> bool:
        return not self.works


def all_gather_pair(out: torch.Tensor, own: torch.Tensor, group: ProcessGroup | None,
                    ) -> PairWork:
    """In-place all-gather of two ranks: ``own`` is this rank's half of ``out`` (already in
    place); send it, receive the peer's half into its place. Returns the pending exchange
    (its ``wait()`` completes it), as an ``async_op=True`` collective returns its work."""
    rank = dist.get_rank(group)
    half = own.numel()
    peer_half = out.view(-1)[(1 - rank) * half:(2 - rank) * half]
    return PairWork([dist.isend(own, group=group, group_dst=1 - rank),
                     dist.irecv(peer_half, group=group, group_src=1 - rank)])
