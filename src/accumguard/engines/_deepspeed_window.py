"""ZeRO-3 parameters kept gathered for a whole window (``window_memory="unsharded"``).

Holding: DeepSpeed has no setting for "gather once per optimizer step", so the partitioned
parameters are marked persistent (``ds_persist``, the flag behind
``stage3_param_persistence_threshold``) for micro-steps 0..K-2 and unmarked before the last
backward, whose release hooks then re-partition them as usual; the parameter coordinator's
cached release sets are cleared at each switch (DeepSpeed 0.19.8 caches them per module).

Hooks (``skip_idle_hooks``): DeepSpeed's ZeRO-3 module hooks run in every forward and
backward of every submodule (fetch, trace, prefetch and release bookkeeping; on CPU,
measured per phase with ``benchmarks/ds_z3_phases.py``, a large share of a held window's
forward). While the parameters are held, they do no work on the numbers: the micro-steps
strictly between the window's first and last find every parameter gathered and release
nothing. So the whole window runs with DeepSpeed's module hooks taken out of the modules'
hook dictionaries and put back, in their original order, when each micro-step ends
(whatever happens in it): at the window's first micro-step the held parameters, all
released then, are gathered in one call of DeepSpeed's own ``all_gather_coalesced`` (what
its coordinator calls, one bucket instead of one per module), and after the last backward
:meth:`HeldParameters.release_window` re-partitions them as DeepSpeed's post-backward hooks
would (every held parameter released when the flush starts, as with the hooks). A
micro-step keeps the hooks whenever a held parameter is not gathered at its start (a
first micro-step that finds some gathered and some not, an idle one after an exception),
when the gather would be quantized or hierarchical (ZeRO++: DeepSpeed's coordinator then
gathers differently), and in a window of one micro-step (nothing is held). The
coordinator's trace and counters are then untouched by held windows (its ``reset_step``, at
the next hooked forward, starts them afresh). Gradient hooks (the per-parameter reduction hooks, a no-op
inside the coalesced block) are not touched. The update is bit-identical to the hooks in
every micro-step (tests/engines/test_deepspeed_window_memory.py).

Gathers by exchange (:meth:`HeldParameters.pair_gathers`): on gloo with 2 ranks, the
window's parameter gather (and those of micro-steps that keep their hooks) run DeepSpeed's
in-place all-gather of a coalesced bucket of partitions as one exchange of halves between
the two ranks (:func:`accumguard.engines._pair.all_gather_pair`): the same bytes in the
same places, about a third less CPU than gloo's all-gather. Any other gather goes to
DeepSpeed's own function; on NCCL (or any other backend) nothing changes.
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
    """The ZeRO-3 parameters held gathered over a window, and the window's module hooks.

    ``skipped`` counts the micro-steps run without DeepSpeed's module hooks,
    ``window_gathers`` the windows gathered here in one call, and ``pair_gathers_done`` the
    parameter gathers served by a 2-rank exchange (the tests read them: the fast paths must
    really be taken). ``whole_window=False`` keeps the hooks in the window's first and last
    micro-steps (DeepSpeed gathers and releases there, module by module)."""

    def __init__(self, engine: Any, *, skip_idle_hooks: bool, pair_gathers: bool = True,
                 whole_window: bool = True) -> None:
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
        self.whole_window = whole_window and bool(self._hook_handles) and \
            self._plain_gathers(coordinator)
        self.window_gathers = 0  # windows whose parameters were gathered here, in one call
        self._release_after = False  # the last micro-step ran without hooks: release here

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

    def _plain_gathers(self, coordinator: Any) -> bool:
        """The held parameters can be gathered here exactly as DeepSpeed's coordinator would:
        no quantized or secondary (hpZ) partitions, the coordinator's own gather unquantized."""
        if coordinator is None or not self.params or \
                getattr(coordinator, "zero_quantized_weights", True) is not False or \
                getattr(coordinator, "zero_quantized_nontrainable_weights", True) is not False:
            return False
        return all(callable(getattr(p, "all_gather_coalesced", None))
                   and getattr(p, "ds_secondary_tensor", 1) is None
                   and not hasattr(getattr(p, "ds_tensor", None), "ds_quant_scale")
                   for p in self.params)

    def _statuses(self) -> set[str | None]:
        return {getattr(getattr(p, "ds_status", None), "name", None) for p in self.params}

    def _gather_window(self) -> bool:
        """At the window's first micro-step, every held parameter released: gather them all in
        one coalesced call (DeepSpeed's ``all_gather_coalesced``, as its coordinator does, the
        2-rank exchange included), so that this micro-step runs without the module hooks too.
        True when every held parameter is gathered afterwards."""
        if self._statuses() != {"NOT_AVAILABLE"}:
            return self._all_gathered()
        with torch.no_grad(), self.pair_gathers():
            self.params[0].all_gather_coalesced(self.params).wait()
        self.window_gathers += 1
        return self._all_gathered()

    def release_window(self) -> None:
        """After the last backward of a window run without the module hooks: release (re-shard)
        the held parameters, as DeepSpeed's post-backward hooks would have."""
        if not self._release_after:
            return
        self._release_after = False
        with torch.no_grad():
            for p in self.params:
                if getattr(getattr(p, "ds_status", None), "name", None) == "AVAILABLE" and \
                        not p.ds_active_sub_modules and not p.ds_persist:
                    p.partition()

    @contextlib.contextmanager
    def around_micro_step(self, position: int, *, last: bool) -> Iterator[None]:
        """Around the micro-step at ``position`` in its window (forward and backward), ``last``
        the window's last: without DeepSpeed's module hooks when it is idle (a held micro-step
        between the window's first and last) and every held parameter is gathered; with
        ``whole_window``, also the window's first micro-step (the parameters gathered here
        first, in one call) and its last (released by :meth:`release_window` after its
        backward); a window of one micro-step holds nothing. Otherwise as is, with the
        parameter gathers of a 2-rank gloo group served by one exchange of halves
        (:meth:`pair_gathers`)."""
        hook_free = False
        if self.holding and self._hook_handles:
            if position > 0 and not last:
                hook_free = self._all_gathered()
            elif self.whole_window:
                hook_free = self._gather_window() if position == 0 else self._all_gathered()
        if not hook_free:
            with self.pair_gathers():
                yield
            return
        self._release_after = last and position > 0
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
