"""ZeRO-3 parameters kept gathered for a whole window (``window_memory="unsharded"``).

Holding: DeepSpeed has no setting for "gather once per optimizer step", so the partitioned
parameters are marked persistent (``ds_persist``, the flag behind
``stage3_param_persistence_threshold``) for micro-steps 0..K-2 and unmarked before the last
backward, whose release hooks then re-partition them as usual; the parameter coordinator's
cached release sets are cleared at each switch (DeepSpeed 0.19.8 caches them per module).

Idle hooks (``skip_idle_hooks``): DeepSpeed's ZeRO-3 module hooks run in every forward
and backward of every submodule (fetch, trace, prefetch and release bookkeeping; on CPU,
measured per phase with ``benchmarks/ds_z3_phases.py``, a large share of a held window's
forward). While the parameters are held, the micro-steps strictly between the window's
first (which gathers them) and its last (whose backward releases them) find every
parameter already gathered and release nothing: their hooks do no work on the numbers.
Those micro-steps run with DeepSpeed's module hooks taken out of the modules' hook
dictionaries and put back, in their original order, when the micro-step ends (whatever
happens in it). Only when every held parameter is gathered at that point; otherwise the
hooks stay (a parameter a micro-step has not used yet is gathered by them). The
coordinator sees the window as first and last micro-step only: both run its
``reset_step`` and trace checks as before, so its recorded module order still matches.
Gradient hooks (the per-parameter reduction hooks, a no-op inside the coalesced block)
are not touched. The update is bit-identical (tests/engines/test_deepspeed_window_memory.py).

Gathers by exchange (:meth:`HeldParameters.pair_gathers`): on gloo with 2 ranks, the
micro-steps that keep their hooks (the window's first, which gathers the parameters, and
its last) run DeepSpeed's in-place all-gather of a coalesced bucket of partitions as one
exchange of halves between the two ranks (:func:`accumguard.engines._pair.all_gather_pair`):
the same bytes in the same places, about a third less CPU than gloo's all-gather. Any other
gather goes to DeepSpeed's own function; on NCCL (or any other backend) nothing changes.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from accumguard.engines import _pair
from accumguard.engines._deepspeed_flush import _own_half_of
from accumguard.engines._hooks_off import hooks_off

__all__ = ["HeldParameters"]

log = logging.getLogger("accumguard")


class HeldParameters:
    """The ZeRO-3 parameters held gathered over a window, and the idle micro-steps' hooks.

    ``skipped`` counts the micro-steps run without DeepSpeed's module hooks, and
    ``pair_gathers_done`` the parameter gathers served by a 2-rank exchange (the tests read
    them: the fast paths must really be taken)."""

    def __init__(self, engine: Any, *, skip_idle_hooks: bool, pair_gathers: bool = True) -> None:
        offload = getattr(engine.optimizer, "parameter_offload", None)
        coordinator = offload.get_param_coordinator() if offload is not None else None
        cached = getattr(type(coordinator),
                         "_PartitionedParameterCoordinator__params_to_release", None)
        self.clear_release_cache: Callable[[], None] | None = None
        # DeepSpeed wraps the lru_cache'd method in an NVTX wrapper without functools.wraps.
        for candidate in (cached, *(c.cell_contents for c in
                                    (getattr(cached, "__closure__", None) or ()))):
            if hasattr(candidate, "cache_clear"):
                self.clear_release_cache = candidate.cache_clear
                break
        self.params = [p for p in engine.module.parameters()
                       if hasattr(p, "ds_persist") and not p.ds_persist]
        self.holding = False
        self.skipped = 0
        self.pair = pair_gathers
        self.pair_gathers_done = 0  # parameter gathers served by a 2-rank exchange
        self._hook_handles = self._module_hook_handles(offload) if skip_idle_hooks else []

    @staticmethod
    def _module_hook_handles(offload: Any) -> list[Any]:
        """DeepSpeed 0.19.8's module hook handles (forward, backward, start of forward);
        empty (hooks never skipped) when this DeepSpeed keeps them elsewhere."""
        handles = [*(getattr(offload, "forward_hooks", None) or ()),
                   *(getattr(offload, "backward_hooks", None) or ())]
        start = getattr(offload, "fwd_pre_hook", None)
        if start is not None:
            handles.append(start)
        if not handles or not all(callable(getattr(h, "hooks_dict_ref", None)) and
                                  hasattr(h, "id") for h in handles):
            log.info("accumguard: DeepSpeed's ZeRO-3 module hooks were not found where "
                     "DeepSpeed 0.19.8 keeps them; the held window runs them every micro-step")
            return []
        return handles

    def hold(self, hold: bool) -> None:
        """Mark the partitioned parameters persistent (held gathered) or not."""
        if hold == self.holding or not self.params:
            return
        for p in self.params:
            p.ds_persist = hold
        self.holding = hold
        assert self.clear_release_cache is not None  # checked by the adapter at construction
        self.clear_release_cache()

    def _all_gathered(self) -> bool:
        for p in self.params:
            status = getattr(p, "ds_status", None)
            if getattr(status, "name", None) != "AVAILABLE":
                return False
        return True

    @contextlib.contextmanager
    def around_micro_step(self, idle: bool) -> Iterator[None]:
        """Around one micro-step (forward and backward): without DeepSpeed's module hooks when
        ``idle`` (a held micro-step between the window's first and last) and every held
        parameter is gathered; otherwise as is, with the parameter gathers of a 2-rank gloo
        group served by one exchange of halves (:meth:`pair_gathers`)."""
        if not (idle and self.holding and self._hook_handles and self._all_gathered()):
            with self.pair_gathers():
                yield
            return
        with hooks_off(self._hook_handles):
            self.skipped += 1
            yield

    @contextlib.contextmanager
    def pair_gathers(self) -> Iterator[None]:
        """gloo, 2 ranks: DeepSpeed's in-place all-gather of a coalesced bucket of parameter
        partitions (this rank's partition is its half of the output) as one exchange of halves
        (:func:`accumguard.engines._pair.all_gather_pair`: the same bytes, no arithmetic, about
        a third less CPU than gloo's all-gather). Any other gather (one parameter at a time,
        quantized, another group size or backend) goes to DeepSpeed's own function."""
        module: Any = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
        real: Callable[..., Any] | None = getattr(module, "_dist_allgather_fn", None)
        if not self.pair or module is None or real is None:
            yield
            return

        def gather(input_tensor: torch.Tensor, output_tensor: torch.Tensor,
                   group: Any = None) -> Any:
            if _own_half_of(output_tensor, input_tensor, group, _ds_comm()):
                self.pair_gathers_done += 1
                return _pair.all_gather_pair(output_tensor, input_tensor, group)
            return real(input_tensor, output_tensor, group)

        module._dist_allgather_fn = gather
        try:
            yield
        finally:
            module._dist_allgather_fn = real


def _ds_comm() -> Any:
    import deepspeed.comm as ds_dist

    return ds_dist
