"""``accumguard advise``'s candidate modes, applied inside the user's unmodified command.

The bootstrap that installs ``watch``'s observer (:mod:`accumguard.watch._recording`) calls
:func:`install_from_env`; with ``ACCUMGUARD_ADVISE_MODE`` unset (``watch``,
``invariance``) it does nothing. With a mode, the outermost call of every DDP / FSDP2
module is wrapped (DDP: its ``__call__``; FSDP2: a forward pre-hook on every module given to
``fully_shard``; through the observer's patch and hook doors, undone with it) and sets the
engine's own switches before the forward, from the micro-step's position in the window:
the observer's count of backward passes since the last optimizer step, against the
window size ``ACCUMGUARD_ADVISE_K`` measured on the command as written.

Modes (each the exact public call a user would write):

* ``ddp-every``: ``model.require_backward_grad_sync = True`` before every forward (DDP
  all-reduces every micro-step);
* ``ddp-deferred``: ``False`` before the forwards of micro-steps 1..K-1, ``True`` before
  the last (what ``with model.no_sync():`` around forward and backward does);
* ``fsdp2-every``: ``model.set_requires_gradient_sync(True)`` before every forward;
* ``fsdp2-deferred``: ``set_requires_gradient_sync(False)`` before micro-steps 1..K-1,
  ``True`` before the last;
* ``fsdp2-unsharded``: deferred, plus ``set_reshard_after_forward(False)`` and
  ``set_reshard_after_backward(False)`` before micro-steps 1..K-1 and
  ``set_reshard_after_backward(True)`` before the last: the parameters gathered by the
  window's first forward stay unsharded until its last backward.

* ``ds-contiguous-gradients-off`` / ``ds-overlap-comm-on`` / ``ds-z3-params-persistent``:
  DeepSpeed's ``zero_optimization`` ``contiguous_gradients: false`` / ``overlap_comm: true``
  / ``stage3_param_persistence_threshold: 1e12`` (ZeRO-3 keeps every parameter gathered),
  set in the config DeepSpeed reads, whatever its form.
* ``ds-coalesced`` (and ``ds-coalesced-contiguous-off``, with ``contiguous_gradients:
  false``): DeepSpeed's coalesced reduction (``engine.coalesce_grad_reduction()``, 0.19)
  in a loop that accumulates natively (config GA = K, ``backward``/``step`` every
  micro-step): the block is entered at the window's first ``engine.backward`` (the
  gradient hooks then leave each gradient on its parameter, where autograd sums it) and
  left right after the backward at the engine's own boundary: DeepSpeed's flush reduces
  the summed gradient once per optimizer step. The loop's ``engine.step()`` calls inside
  the block (not at a boundary: they only count the micro-step) run with the block's
  guard against ``step()`` lifted. A loop whose every backward is a boundary (GA = 1) is
  left alone, and the mode reports it as not applied.

A micro-step at or beyond the K-th of a window (a longer window than measured) always
synchronises: a mode never leaves a window's last backward unreduced.
"""

from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import torch
    from deepspeed import DeepSpeedEngine
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    from accumguard.observe._failsafe import Original
    from accumguard.observe._seams import PatchHost

__all__ = ["ENV_ADVISE_K", "ENV_ADVISE_MODE", "MODES", "install_from_env"]

ENV_ADVISE_MODE = "ACCUMGUARD_ADVISE_MODE"
ENV_ADVISE_K = "ACCUMGUARD_ADVISE_K"

#: mode -> engine it applies to
MODES = {"ddp-every": "ddp", "ddp-deferred": "ddp", "fsdp2-every": "fsdp2",
         "fsdp2-deferred": "fsdp2", "fsdp2-unsharded": "fsdp2",
         "ds-contiguous-gradients-off": "deepspeed", "ds-overlap-comm-on": "deepspeed",
         "ds-z3-params-persistent": "deepspeed", "ds-coalesced": "deepspeed",
         "ds-coalesced-contiguous-off": "deepspeed"}

#: DeepSpeed modes: the ``zero_optimization`` keys each one sets, and their values
DS_SETTINGS: dict[str, dict[str, object]] = {
    "ds-contiguous-gradients-off": {"contiguous_gradients": False},
    "ds-overlap-comm-on": {"overlap_comm": True},
    "ds-z3-params-persistent": {"stage3_param_persistence_threshold": 10 ** 12},
    "ds-coalesced": {},
    "ds-coalesced-contiguous-off": {"contiguous_gradients": False},
}
#: DeepSpeed modes that coalesce the window's gradient reduction (see the module)
DS_COALESCED = frozenset({"ds-coalesced", "ds-coalesced-contiguous-off"})


class _Applier:
    """Sets the engine's switches before each outermost DDP/FSDP2 forward (see the module)."""

    def __init__(self, observer: PatchHost, mode: str, k: int) -> None:
        self.observer = observer
        self.mode = mode
        self.k = max(1, k)
        self.applied: list[str] = []  # what was set, for the recording's end record
        # DeepSpeed engine id -> its open coalesce_grad_reduction() block (ds-coalesced)
        self._blocks: dict[int, contextlib.AbstractContextManager[None]] = {}

    def last(self) -> bool:
        """Is the micro-step about to run the window's last (or beyond)?"""
        return len(self.observer._w.backwards) >= self.k - 1

    def patch_ddp(self, module: ModuleType) -> None:
        self.observer.patches.wrap(module.DistributedDataParallel, "__call__", self._ddp_call)

    def patch_fsdp(self, module: ModuleType) -> None:
        """Every module given to ``fully_shard`` gets a forward pre-hook (prepended: it runs
        before FSDP2's own, which all-gathers) setting that module's own switches
        (``recurse=False``): FSDP2 reads each module's flags at its own forward and
        post-backward, so each module is set right before it runs."""
        self.observer.patches.wrap(module, "fully_shard", self._fully_shard)

    def _fully_shard(self, orig: Original) -> Original:
        import torch

        from accumguard.observe._hookref import ModuleHook

        def fully_shard(*args: object, **kwargs: object) -> object:
            out = orig(*args, **kwargs)
            hook = self.observer.failsafe.hook(self._fsdp_pre, "advise_fsdp")
            for m in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(m, torch.nn.Module) and hasattr(m, "set_requires_gradient_sync"):
                    self.observer.patches.add(
                        m.register_forward_pre_hook(ModuleHook(hook), prepend=True).remove)
            return out

        return fully_shard

    def _fsdp_pre(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        import torch

        if not torch.is_grad_enabled():
            return
        # hooked on fully_shard's outputs only: each is an FSDPModule (a class torch mixes
        # into the module's own), which the checker cannot see on an nn.Module
        model = cast("FSDPModule", module)
        last = self.mode == "fsdp2-every" or self.last()
        if not self.applied:
            self.applied.append("FSDP2 switches set before each module's forward")
        model.set_requires_gradient_sync(last, recurse=False)
        if self.mode == "fsdp2-unsharded":
            if not last:
                model.set_reshard_after_forward(False, recurse=False)
            model.set_reshard_after_backward(last, recurse=False)

    def _ddp_call(self, orig: Original) -> Original:
        import torch

        def call(model: DistributedDataParallel, *args: object, **kwargs: object) -> object:
            if torch.is_grad_enabled():
                model.require_backward_grad_sync = self.mode == "ddp-every" or self.last()
                if not self.applied:
                    self.applied.append("require_backward_grad_sync set before each forward")
            return orig(model, *args, **kwargs)

        return call


    def patch_deepspeed(self, module: ModuleType) -> None:
        """DeepSpeed reads its config (dict, file or base64) into one dict and passes it to
        ``_reject_removed_config_keys`` first: the mode's ``zero_optimization`` key is set
        in that dict there, before anything reads it (every form of config, no file
        touched). Another DeepSpeed version without that function: not applied (the end
        record says so and ``advise`` reports the mode as not applicable)."""
        self.observer.patches.wrap(module, "_reject_removed_config_keys", self._ds_config)

    def _ds_config(self, orig: Original) -> Original:
        settings = DS_SETTINGS[self.mode]

        def reject_removed_config_keys(config: object, *args: object,
                                       **kwargs: object) -> object:
            if isinstance(config, dict):
                zero = config.setdefault("zero_optimization", {})
                if isinstance(zero, dict):
                    for key, value in settings.items():
                        zero[key] = value
                        self.applied.append(f"zero_optimization.{key} = {value}")
            return orig(config, *args, **kwargs)

        return reject_removed_config_keys

    def patch_deepspeed_engine(self, module: ModuleType) -> None:
        """``DeepSpeedEngine.backward`` and ``step`` wrapped: see ``ds-coalesced`` above."""
        self.observer.patches.wrap(module.DeepSpeedEngine, "backward", self._ds_backward)
        self.observer.patches.wrap(module.DeepSpeedEngine, "step", self._ds_step)

    def _ds_backward(self, orig: Original) -> Original:
        def backward(engine: DeepSpeedEngine, *args: object, **kwargs: object) -> object:
            boundary = engine.is_gradient_accumulation_boundary()
            block = self._blocks.get(id(engine))
            if block is None and not boundary and not engine.inside_no_sync_ctxt:
                block = engine.coalesce_grad_reduction()
                block.__enter__()
                self._blocks[id(engine)] = block
                if "coalesced reduction" not in self.applied:
                    self.applied.append("coalesced reduction")
            try:
                return orig(engine, *args, **kwargs)
            finally:
                if block is not None and boundary:
                    del self._blocks[id(engine)]
                    block.__exit__(None, None, None)  # DeepSpeed's flush: one reduction
        return backward

    def _ds_step(self, orig: Original) -> Original:
        def step(engine: DeepSpeedEngine, *args: object, **kwargs: object) -> object:
            if id(engine) not in self._blocks:
                return orig(engine, *args, **kwargs)
            # a non-boundary step() of the native loop inside the open block: it only
            # counts the micro-step; the block's guard against step() is lifted for it
            engine.inside_no_sync_ctxt = False
            try:
                return orig(engine, *args, **kwargs)
            finally:
                engine.inside_no_sync_ctxt = True
        return step

def install_from_env(observer: PatchHost | None) -> _Applier | None:
    """Apply ``ACCUMGUARD_ADVISE_MODE`` (if set) through ``observer``'s patches."""
    mode = os.environ.get(ENV_ADVISE_MODE, "")
    if mode not in MODES or observer is None or not observer.installed:
        return None
    k_text = os.environ.get(ENV_ADVISE_K, "")
    applier = _Applier(observer, mode, int(k_text) if k_text.strip().isdigit() else 1)
    from accumguard.observe._imports import when_imported

    fs = observer.failsafe
    if MODES[mode] == "ddp":
        when_imported("torch.nn.parallel.distributed",
                      lambda m: fs.guard("advise: DDP mode", applier.patch_ddp, m))
    elif MODES[mode] == "fsdp2":
        when_imported("torch.distributed.fsdp",
                      lambda m: fs.guard("advise: FSDP2 mode", applier.patch_fsdp, m))
    else:
        if DS_SETTINGS.get(mode):
            when_imported("deepspeed.runtime.config", lambda m: fs.guard(
                "advise: DeepSpeed mode", applier.patch_deepspeed, m))
        if mode in DS_COALESCED:
            when_imported("deepspeed.runtime.engine", lambda m: fs.guard(
                "advise: DeepSpeed coalesced", applier.patch_deepspeed_engine, m))
    return applier
