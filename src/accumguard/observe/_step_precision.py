"""The step record's precision facts, read per optimizer (engine) and cached.

A mixin of :class:`~._observer.Observer` (:meth:`._steps.StepMachinery._end_step` calls
it): the parameters' dtype and :func:`._precision.step_facts` (the tracked parameters'
least precise dtype, FSDP2's and DeepSpeed's configured dtypes, the window's autocast and
where the model's gradient was summed), read once per owner since a model does not change
dtype between steps.
"""

from __future__ import annotations

from typing import Any

import torch

from accumguard.observe._introspect import param_dtype
from accumguard.observe._precision import (
    LOW,
    AccumDrift,
    MasterSum,
    deepspeed_dtypes,
    fsdp_dtypes,
    least_precise,
    name_of,
    step_facts,
)
from accumguard.observe._seams import as_deepspeed
from accumguard.observe._steps import _GONE
from accumguard.observe._window import StepTally

__all__ = ["StepPrecision"]


class StepPrecision:
    """``_dtype_of`` and ``_precision`` (state: the observer's ``_dtypes`` and
    ``_prec_static`` caches, set up in ``Observer.__init__``)."""

    # (attributes of the observer this mixin uses; typed here for readers and checkers)
    _dtypes: dict[int, str | None]
    # (parameters' dtype, FSDP2's dtypes, DeepSpeed's dtypes) per (owner, tracked count)
    _prec_static: dict[tuple[int, int],
                       tuple[str | None, dict[str, str] | None, dict[str, str] | None]]
    _tracked: list[torch.Tensor]
    _fsdp_groups: dict[int, list[object]]
    _step_master: MasterSum | None
    drift: AccumDrift

    def _dtype_of(self, owner: object) -> str | None:
        """:func:`_param_dtype`, once per optimizer/engine (it walks every parameter; a
        model does not change dtype between steps)."""
        key = id(owner)
        if key not in self._dtypes:
            self._dtypes[key] = param_dtype(owner)
        return self._dtypes[key]

    def _precision(self, owner: object, source: str, w: StepTally) -> dict[str, Any] | None:
        """The step record's ``precision`` (:func:`._precision.step_facts`); the per-owner
        part is read once (again when a parameter is tracked or FSDP2 was not set up yet)."""
        key = (id(owner), len(self._tracked))
        static = self._prec_static.get(key)
        if static is None:
            groups = [g for gs in self._fsdp_groups.values() for g in gs]
            fsdp = fsdp_dtypes(groups) if groups else None
            static = (least_precise(name_of(p.dtype) for p in self._tracked if p is not _GONE),
                      fsdp, deepspeed_dtypes(as_deepspeed(owner))
                      if source == "deepspeed" and isinstance(owner, torch.nn.Module) else None)
            if fsdp is not None or not groups:
                self._prec_static = {key: static}
        return step_facts(params=static[0], fsdp=static[1], deepspeed=static[2],
                          autocast=w.autocast, model_grad=self._step_master,
                          drift=self.drift.take() if self.drift.shadows else None)

    def _watch_drift(self) -> None:
        """Before an observed backward whose tracked parameters or FSDP2 roots changed in
        number since the last call (the caller compares ``drift.key``): let
        :class:`._precision.AccumDrift` hook the low-precision parameters whose ``.grad`` a
        window may sum (the tracked ones, FSDP2's unsharded ones)."""
        key = (len(self._tracked), len(self._fsdp_groups))
        fps = [fp for gs in self._fsdp_groups.values() for g in gs
               for fp in getattr(g, "fsdp_params", None) or []]
        made = [getattr(fp, "_unsharded_param", None) for fp in fps]
        # (FSDP2 makes its unsharded parameters at its first all-gather: until then, again)
        self.drift.watch(key if all(isinstance(p, torch.Tensor) for p in made) else None,
                         [p for p in self._tracked if p is not _GONE]
                         + [p for p in made if isinstance(p, torch.Tensor) and p.dtype in LOW])
