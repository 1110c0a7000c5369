"""``DistributedDataParallel``: averages gradients over ranks during backward.

DDP decides whether a backward all-reduces when the *forward* runs (it reads
``require_backward_grad_sync`` there), so a deferred micro-step puts forward
and backward inside ``no_sync()``. The adapter counts DDP's bucket all-reduces
through a communication hook that does exactly what DDP's built-in reduction
does (divide by W, all-reduce SUM), so counting does not change the numbers.

The counting hook is **off by default**: a Python comm hook replaces DDP's C++
built-in reduction (the GIL is taken once per bucket) and DDP allows one hook per
model, so it would collide with the user's own (e.g. compression) hook. Turn it on
with ``count_collectives=True`` or, for a whole test run or audit, the environment
variable ``ACCUMGUARD_COUNT_COLLECTIVES=1`` (the test suite sets it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from accumguard.core.errors import ConfigError
from accumguard.core.scaling import GradReduction
from accumguard.engines.base import Engine, group_or_world

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

#: Environment switch for the counting comm hook when ``count_collectives`` is not given.
COUNT_ENV = "ACCUMGUARD_COUNT_COLLECTIVES"


class _CommCounter:
    """State of the counting comm hook: bucket all-reduces and backward passes that synced."""

    def __init__(self, process_group: ProcessGroup | None) -> None:
        self.process_group = process_group
        self.bucket_reductions = 0
        self.sync_rounds = 0


def _counting_allreduce(state, bucket):  # type: ignore[no-untyped-def]  # noqa: ANN001 - DDP rejects string annotations
    """DDP's own reduction (divide by W, all-reduce SUM), counted."""
    state.bucket_reductions += 1
    if bucket.is_last():
        state.sync_rounds += 1
    group = group_or_world(state.process_group)
    tensor = bucket.buffer()
    tensor.div_(group.size())
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class DDPEngine(Engine):
    """Adapter for a ``DistributedDataParallel``-wrapped model.

    ``sync="deferred"`` (default) runs micro-steps 1..K-1 under ``no_sync``:
    one all-reduce round per optimizer step. ``sync="eager"`` reduces every
    micro-step (K rounds; only useful to compare). ``count_collectives=True``
    installs the counting hook (``None``, the default: only when the environment sets
    ``ACCUMGUARD_COUNT_COLLECTIVES=1``); without it :meth:`grad_collectives` is ``None``.
    """

    name = "ddp"

    def __init__(self, model: DistributedDataParallel, *, sync: str = "deferred",
                 count_collectives: bool | None = None) -> None:
        if not isinstance(model, DistributedDataParallel):
            raise ConfigError(
                f"DDPEngine needs a DistributedDataParallel model, got {type(model).__name__}; "
                "wrap it first: model = DistributedDataParallel(model)"
            )
        if sync not in ("deferred", "eager"):
            raise ConfigError(f"sync ({sync!r}) must be 'deferred' or 'eager'")
        super().__init__(model, process_group=model.process_group)
        self._ddp = model
        self.sync_mode = sync
        self._counter: _CommCounter | None = None
        self._main_rounds = 0  # fp32 main-gradient all-reduces (see set_accumulation_dtype)
        if count_collectives is None:
            count_collectives = os.environ.get(COUNT_ENV, "") == "1"
        if count_collectives:
            counter = _CommCounter(model.process_group)
            try:
                model.register_comm_hook(counter, _counting_allreduce)
            except RuntimeError as err:
                raise ConfigError(
                    "this DDP model already has a communication hook (yours, or the counting "
                    "hook of an earlier accumguard adapter: DDP allows one per model and "
                    "cannot remove it); pass DDPEngine(model, count_collectives=False) and "
                    "the adapter will not count all-reduces") from err
            self._counter = counter

    def reduction(self) -> GradReduction:
        return GradReduction(world_size=self.world_size, averages_over_ranks=True)

    def set_accumulation_dtype(self, mode: str) -> str:
        """fp32 main gradients: every micro-step runs under ``no_sync`` and the boundary
        all-reduces the fp32 buffer once (a flat fp32 all-reduce, divided by W like DDP's own
        reduction), so neither the window's sum nor the reduction is done in bf16/fp16."""
        dtype = self._enable_main_grads(mode)
        if self.main_grads is not None and self.sync_mode == "eager":
            raise ConfigError(
                "DDPEngine(sync='eager') with fp32 gradient accumulation of bf16/fp16 "
                "parameters: eager mode reduces every micro-step in the parameters' dtype. "
                "Use sync='deferred' (default), or accumulation_dtype='native'")
        return dtype

    def sync(self) -> None:
        if self.main_grads is None:
            return
        group = group_or_world(self.process_group)
        world = group.size()

        def all_reduce_mean(flat: torch.Tensor) -> None:
            flat.div_(world)
            dist.all_reduce(flat, group=group)

        self.main_grads.flush(all_reduce_mean)
        self._main_rounds += 1

    @contextlib.contextmanager
    def micro_step(self, *, is_last: bool) -> Iterator[None]:
        ddp = self._ddp
        # With fp32 main gradients every micro-step is local: the boundary reduces the buffer.
        if self.main_grads is None and (is_last or self.sync_mode == "eager"):
            yield
        else:
            with ddp.no_sync():
                yield

    def grad_collectives(self) -> int | None:
        if self._counter is None:
            return None
        return self._counter.sync_rounds + self._main_rounds

    @property
    def bucket_reductions(self) -> int | None:
        """Individual bucket all-reduces (a large model has several buckets per sync round)."""
        return None if self._counter is None else self._counter.bucket_reductions
