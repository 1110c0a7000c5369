"""What one guard watches: which optimizer steps, schedulers, zero_grads and clips are its own.

The observation layer reports every event of the process; a guard keeps those of its
model and optimizer. The objects people pass are often wrappers: Accelerate's
``AcceleratedOptimizer`` / ``AcceleratedScheduler`` step an inner torch object (the one
the observer sees), ``ZeroRedundancyOptimizer`` steps an inner optimizer (the observer
reports the outer one), and a DeepSpeed engine steps through ``engine.step()`` whatever
optimizer object the caller holds (``None``, the client optimizer or the engine's ZeRO
optimizer).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from accumguard.core.errors import ConfigError
from accumguard.engines.registry import is_ddp, is_deepspeed_engine

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["Targets", "resolve_targets", "step_hook_owner"]

_INNER = ("optimizer", "_optimizer", "optim")  # Accelerate, Lightning, ZeroRedundancyOptimizer



@dataclass
class Targets:
    model: torch.nn.Module
    params: list[torch.Tensor]
    param_ids: frozenset[int]
    optimizer_ids: frozenset[int]  # any of these stepping is this guard's step (torch path)
    deepspeed: torch.nn.Module | None  # the DeepSpeed engine whose engine.step() is this guard's step, or None
    ddp: DistributedDataParallel | None  # the DistributedDataParallel model (sync-flag checks), or None
    scheduler_ids: frozenset[int]
    scaler: object  # the GradScaler the loop uses (matched by identity), or None

    def owns_optimizer(self, opt: object) -> bool:
        if id(opt) in self.optimizer_ids:
            return True
        first = _first_param(opt)
        return first is not None and id(first) in self.param_ids

    def owns_module(self, module: object) -> bool:
        if module is self.model or module is getattr(self.model, "module", None):
            return True
        params = getattr(module, "parameters", None)
        first = next(iter(params()), None) if callable(params) else None
        return first is not None and id(first) in self.param_ids

    def owns_step(self, owner: object, source: str) -> bool:
        if source == "deepspeed":
            return self.deepspeed is not None and (
                owner is self.deepspeed or getattr(owner, "module", None) is self.model)
        return self.deepspeed is None and id(owner) in self.optimizer_ids


def _first_param(opt: object) -> object:
    for group in getattr(opt, "param_groups", None) or []:
        for p in group.get("params", []):
            return p
    return None


def _chain(obj: object, attrs: tuple[str, ...] = _INNER) -> Iterator[object]:
    """``obj`` and the objects it wraps (Accelerate/Lightning/ZeRO wrappers), outermost first."""
    seen: set[int] = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        yield obj
        obj = next((getattr(obj, a) for a in attrs if getattr(obj, a, None) is not None
                    and hasattr(getattr(obj, a), "step")), None)


def resolve_targets(model: object, optimizer: object, scheduler: object, scaler: object) -> Targets:
    """Check what the caller passed and derive the identities events are matched against."""
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module (the model as the loop calls it: "
                          f"the DDP/FSDP2 module or the DeepSpeed engine), got "
                          f"{type(model).__name__}")
    engine = model if is_deepspeed_engine(model) else None
    opt_ids: set[int] = set()
    if engine is None:
        if optimizer is None:
            raise ConfigError("optimizer is None: pass the optimizer the loop steps (None is "
                              "accepted only with a DeepSpeed engine as model)")
        chain = list(_chain(optimizer))
        if any(type(o).__module__.startswith("deepspeed") for o in chain):
            raise ConfigError(f"optimizer {type(optimizer).__name__} belongs to a DeepSpeed "
                              f"engine but model is a {type(model).__name__}: pass the engine "
                              "returned by deepspeed.initialize as model (optimizer may be None)")
        torch_opts = [o for o in chain if isinstance(o, torch.optim.Optimizer)
                      and hasattr(o, "param_groups")]
        if not torch_opts:
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer (or a wrapper of one: "
                              f"Accelerate's AcceleratedOptimizer, ZeroRedundancyOptimizer; or "
                              f"None with a DeepSpeed engine), got {type(optimizer).__name__}")
        opt_ids = {id(o) for o in chain}
    base = getattr(model, "module", model) if engine is not None else model
    params = [p for p in base.parameters() if p.requires_grad]
    sched_ids = frozenset(id(s) for s in _chain(scheduler, ("scheduler",))) \
        if scheduler is not None \
        else frozenset()
    return Targets(model=model, params=params, param_ids=frozenset(id(p) for p in params),
                   optimizer_ids=frozenset(opt_ids), deepspeed=engine,
                   ddp=model if is_ddp(model) else None, scheduler_ids=sched_ids, scaler=scaler)


def step_hook_owner(optimizer: object) -> torch.optim.Optimizer | None:
    """The innermost torch optimizer behind ``optimizer``'s wrappers whose own step hooks are
    set up (Accelerate's and Lightning's wrappers subclass ``Optimizer`` without running its
    ``__init__``); it steps once per step of the outermost one. None: none found."""
    owner = None
    for obj in _chain(optimizer):
        if isinstance(obj, torch.optim.Optimizer) and "_optimizer_step_pre_hooks" in vars(obj):
            owner = obj
    return owner
