"""Single process, plain ``nn.Module``: the engine does nothing to gradients."""

from __future__ import annotations

from typing import Any

import torch

from accumguard.core.errors import ConfigError
from accumguard.core.scaling import GradReduction
from accumguard.engines.base import Engine


class LocalEngine(Engine):
    """A model trained in one process (or replicated by hand: then no rank averaging happens)."""

    name = "local"
    sync_mode = "none"

    def __init__(self, model: torch.nn.Module, **options: Any) -> None:
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(
                f"the model is a {type(model).__name__} ({model!r:.60}); expected a "
                "torch.nn.Module (plain, DistributedDataParallel or fully_shard) or the engine "
                "returned by deepspeed.initialize. Pass the model object itself")
        super().__init__(model, **options)
        # An unwrapped model is trained by this process alone, even when a process group
        # exists: no count all-gather, N is this process's count.
        self.world_size = 1

    def reduction(self) -> GradReduction:
        return GradReduction(world_size=1, averages_over_ranks=False)

    def set_accumulation_dtype(self, mode: str) -> str:
        return self._enable_main_grads(mode)

    def sync(self) -> None:
        if self.main_grads is not None:
            self.main_grads.flush()

    def grad_collectives(self) -> int:
        return 0
