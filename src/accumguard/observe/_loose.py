"""The parameters an optimizer steps that no data-parallel wrapper reduces (a mixin of the
step machinery): DDP averages the parameters it registered, requiring a gradient, when it
was built; FSDP2 reduces its units' DTensor parameters. Per step the record names those
others, and gives the ranks something to compare them by: the step's checksum rows (FSDP2)
or their ``.grad`` read after the step where that checksum is not kept (Lightning's closure).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from contextlib import AbstractContextManager
from itertools import chain
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

import torch

from accumguard.observe._introspect import local

__all__ = ["LooseParameters"]

_PARAMS = itemgetter("params")
_REQUIRES_GRAD = attrgetter("requires_grad")


class LooseParameters:
    """``_unwrapped``/``_loose_grads``/``_loose_untracked``/``_loose_checksum`` (state set up in
    ``Observer.__init__``)."""

    engine: str
    _sync_roots: list[torch.nn.Module]
    _tracked: list[torch.Tensor]
    _tracked_ids: set[int]
    _tracked_names: dict[int, str]
    _step_members: list[bool] | None
    _step_checksum: torch.Tensor | None
    _unwrapped_of: dict[tuple[int, int, int], list[str]]
    _loose_of: dict[tuple[int, int, int], list[torch.Tensor]]
    _loose_key: dict[int, tuple[int, int, int]]
    ddp_frozen: MutableMapping[object, frozenset[int]]
    _ds_engine: torch.nn.Module | None

    if TYPE_CHECKING:  # defined by the observer
        def _quiet(self) -> AbstractContextManager[None]: ...

    def _unwrapped(self, opt: object) -> list[str] | None:
        """The parameters ``opt`` steps that no DDP root reduces (DDP averages the gradients
        of the parameters it registered when it was built; DeepSpeed's ZeRO-0 those of the
        engine's module): up to three names and a count of the rest; None when there are
        none. Once per optimizer and set of roots."""
        if self.engine == "deepspeed":
            opt = getattr(opt, "optimizer", opt)  # (the step's owner is the engine)
        # (the trainable count in the key: a parameter unfrozen after DDP was built is one
        # DDP never registered; the loops are C's, as in _grad_state)
        trainable = sum(map(_REQUIRES_GRAD, chain.from_iterable(
            map(_PARAMS, getattr(opt, "param_groups", [])))))
        key = (id(opt), len(self._sync_roots), trainable)
        names = self._unwrapped_of.get(key)
        if names is None:
            params = [p for g in getattr(opt, "param_groups", []) for p in g["params"]]
            if self.engine == "fsdp2":
                # a fully_shard unit holds DTensor parameters; a plain tensor is in none
                loose = [p for p in params if _plain(p) and p.requires_grad]
            elif self.engine == "deepspeed":
                module = getattr(self._ds_engine, "module", None)
                stage = getattr(self._ds_engine, "zero_optimization_stage", None)
                ds_opt = getattr(self._ds_engine, "optimizer", None)
                # a torch optimizer of the script's own beside the engine (a loss weighting's
                # SGD) steps what no engine reduces, whatever the ZeRO stage
                own = opt is ds_opt or opt is getattr(ds_opt, "optimizer", None)
                if module is None or not callable(stage) or (own and stage() != 0):
                    return None  # (ZeRO-1/2/3 reduce every partition of the optimizer's groups)
                with self._quiet():
                    held = {id(p) for p in module.parameters()}
                if own and not any(id(p) in held for p in params):
                    return None  # not the module's own tensors: nothing to compare them with
                loose = [p for p in params if id(p) not in held and p.requires_grad]
            else:
                roots = [r for r in self._sync_roots if hasattr(r, "require_backward_grad_sync")]
                if not roots:
                    return None
                with self._quiet():
                    # DDP reduces the parameters it registered when it was built (a module
                    # replaced afterwards, or one it was told to ignore, is not among them)
                    held = {id(p) for r in roots for p in _registered(r)
                            if id(p) not in self.ddp_frozen.get(r, ())}
                    loose = [p for p in params if id(p) not in held and p.requires_grad]
            names = [self._tracked_names.get(id(p), f"a {tuple(p.shape)} tensor")
                     for p in loose[:3]] + ([f"{len(loose) - 3} more"] if len(loose) > 3 else [])
            self._unwrapped_of[key] = names
            self._loose_of[key] = loose
        self._loose_key[id(opt)] = key
        return names or None

    def _loose_grads(self, opt: object) -> list[float] | None:
        """``[sum, sum of squares]`` of the ``.grad`` the stepped parameters no wrapper
        reduces hold right after the step (:meth:`_unwrapped`'s): the same on every rank when
        something averaged them. Read where the step's own checksum is not kept (a backward
        inside the step's closure: Lightning), for those few parameters only."""
        loose = self._loose_of.get(self._loose_key.get(id(opt), (0, 0, 0)))
        if not loose:
            return None
        with self._quiet():
            grads = [p.grad for p in loose if p.grad is not None]
            if not grads:
                return None
            flat = torch.cat([local(g).detach().float().reshape(-1) for g in grads])
            return [float(x) for x in torch.stack([flat.sum(), flat.pow(2).sum()]).tolist()]

    def _loose_untracked(self, opt: object) -> bool:
        """Some stepped parameter no wrapper reduces is outside the step's checksum (not a
        parameter of the wrapped model)."""
        loose = self._loose_of.get(self._loose_key.get(id(opt), (0, 0, 0))) or ()
        return any(id(p) not in self._tracked_ids for p in loose)

    def _loose_checksum(self) -> list[float] | None:
        """FSDP2: the checksum of the step's gradients of the stepped parameters no
        ``fully_shard`` unit holds (plain tensors), the same on every rank when they were
        averaged; None when there are none."""
        members, chk = self._step_members, self._step_checksum
        if members is None or chk is None:
            return None
        picked = [m and _plain(p) for p, m in zip(self._tracked, members, strict=False)]
        picked = picked[:len(chk)]
        if not any(picked):
            return None
        mask = torch.tensor(picked + [False] * (len(chk) - len(picked)), dtype=torch.bool)
        return [float(x) for x in chk[mask].sum(0)]


def _plain(p: Any) -> bool:
    """Not a DTensor (FSDP2 shards the parameters of its units as DTensors)."""
    return getattr(p, "to_local", None) is None


def _registered(root: Any) -> list[Any]:
    """The parameters a DDP module reduces: those it registered at construction
    (``_module_parameters``, the ignored ones left out), else its module's."""
    params = getattr(root, "_module_parameters", None)
    return params if isinstance(params, list) else list(root.parameters())
