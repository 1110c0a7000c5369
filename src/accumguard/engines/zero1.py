"""ZeRO-1 on plain torch: ``ZeroRedundancyOptimizer`` over ``DistributedDataParallel``.

Gradients are reduced exactly as by DDP (each rank ends the window with the full
averaged gradient), so this adapter *is* :class:`~accumguard.engines.ddp.DDPEngine`
for everything gradient-related: the same deferred ``no_sync`` window, the same
reduction data, the same counting comm hook. Only the optimizer differs: each
rank keeps the optimizer state of its shard of the parameters, steps that shard,
and ``step()`` then broadcasts the updated parameters from their owners. Those
broadcasts move parameters, not gradients, so they are not counted as gradient
collectives.

Clipping is plain ``clip_grad_norm_`` on the full gradients: after DDP's
all-reduce every rank holds the same full gradient, so every rank computes the
same global norm and clips identically (before the sharded step reads it).
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from accumguard.core.errors import ConfigError
from accumguard.engines.base import dist_info
from accumguard.engines.ddp import DDPEngine

__all__ = ["Zero1Engine"]


class Zero1Engine(DDPEngine):
    """Adapter for a DDP model stepped by ``torch.distributed.optim.ZeroRedundancyOptimizer``.

    Args:
        model: the ``DistributedDataParallel`` model.
        optimizer: its ``ZeroRedundancyOptimizer`` (over ``model.parameters()``).
        sync: ``"deferred"`` (default; one all-reduce round per optimizer step) or
            ``"eager"`` (one per micro-step).
        count_collectives: install DDP's counting comm hook (default: see
            :class:`~accumguard.engines.ddp.DDPEngine`).
    """

    name = "zero1"

    def __init__(self, model: DistributedDataParallel, optimizer: torch.optim.Optimizer, *,
                 sync: str = "deferred", count_collectives: bool | None = None) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            raise ConfigError(
                f"Zero1Engine needs a torch.distributed.optim.ZeroRedundancyOptimizer, got "
                f"{type(optimizer).__name__}; build it as ZeroRedundancyOptimizer("
                "model.parameters(), optimizer_class=torch.optim.AdamW, lr=...) or use "
                "engine='ddp' for a plain optimizer")
        if getattr(optimizer, "_overlap_with_ddp", False):
            raise ConfigError(
                "ZeroRedundancyOptimizer(overlap_with_ddp=True) steps inside DDP's comm hook, "
                "i.e. on every backward that syncs, which cannot be deferred to the "
                "accumulation boundary; construct it with overlap_with_ddp=False (the default)")
        super().__init__(model, sync=sync, count_collectives=count_collectives)
        _, zero_world = dist_info(optimizer.process_group)
        if zero_world != self.world_size:
            raise ConfigError(
                f"ZeroRedundancyOptimizer shards over {zero_world} ranks but DDP reduces over "
                f"{self.world_size}; pass the DDP process group to both "
                "(ZeroRedundancyOptimizer(..., process_group=ddp.process_group))")
        self.optimizer = optimizer

    def bind(self, optimizer: torch.optim.Optimizer | None, accumulation_steps: int) -> None:
        if optimizer is not self.optimizer:
            raise ConfigError(
                "the Accumulator was given a different optimizer than the Zero1Engine; pass "
                "the same ZeroRedundancyOptimizer to both")
