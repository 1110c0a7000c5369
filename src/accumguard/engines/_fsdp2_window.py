"""FSDP2's idle micro-steps inside a window that keeps the parameters unsharded.

With ``window_memory="unsharded"`` and ``sync="deferred"``, the micro-steps strictly between
the window's first (whose forward all-gathers the parameters) and its last (whose backward
reduce-scatters and reshards) find every parameter unsharded and reduce nothing. FSDP2's
per-module hooks still run in each of them: the forward pre-hook (training-state switch, an
``unshard`` that returns at once, the post-backward autograd function on the inputs), the
forward post-hook (a ``reshard`` that returns at once, the module's entry in the prefetch
order, a pre-backward hook on every output), and in backward the pre-backward hook (an
``unshard`` and a prefetch that return at once) and the post-backward hook, which leaves
the gradient where autograd accumulated it (``reduce_grads`` is off) unless a mixed-precision
``reduce_dtype`` asks for an upcast copy. On CPU that bookkeeping is a measurable share of a
micro-step (``benchmarks/fsdp2_phases.py``).

:class:`IdleHooks` takes the forward pre- and post-hooks of every non-root, single-module
FSDP2 state out of its module's hook dictionaries for such a micro-step and puts them back,
in their original order, when it ends (whatever happens in it). Without its forward hooks a
module registers no backward hooks either; at the end of the backward the root's final
callback (the root keeps its hooks: it moves inputs to the device on GPU) runs the skipped
groups' ``post_backward``, which finds nothing to reduce and nothing to move.

Bit-identical by construction when, and only when, the hooks would not touch the numbers:

* every group of a skipped state is unsharded, idle, with no all-gather pending and no
  upcast gradient buffer (``unsharded_accumulated_grad``), checked before every micro-step;
* its ``MixedPrecisionPolicy`` casts nothing (``param_dtype`` and ``output_dtype`` unset, so
  no input or output cast) and its ``reduce_dtype`` is unset or the gradients' own dtype (so
  the post-backward hook would not move the gradient into an upcast buffer); parameters are
  not offloaded to CPU;
* no module of the model is compiled (``module.compile()``): toggling hooks would change
  what dynamo guards on.

Otherwise the hooks stay (the correct, slower path). FSDP2 keeps its hook handles and
states in private attributes (torch 2.13's ``_pre_forward_hook_handle``,
``_fsdp_param_groups``, ...): when they are not where expected, nothing is skipped.

A second, related fix: FSDP2 records each forward's module order (``post_forward_order``)
to prefetch in backward, and clears it only after a backward that ends the gradient
accumulation (``set_is_last_backward(True)``). The deferred window sets that flag to False
until its last micro-step, so in the last backward the first module prefetched the
*previous* micro-step's last module, which that backward had just resharded: one wasted
all-gather per window (the "few gathers remain" of docs/dev/performance-journal.md).
:meth:`IdleHooks.forget_forward_order` clears the order before the last micro-step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from accumguard.engines._hooks_off import hooks_off

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

__all__ = ["IdleHooks"]

log = logging.getLogger("accumguard")


def _handle_parts(handle: Any) -> list[Any]:
    """A RemovableHandle, or the handles of a ``_MultiHandle``."""
    parts = getattr(handle, "handles", None)
    return list(parts) if parts is not None else [handle]


class IdleHooks:
    """The forward hooks of the non-root FSDP2 states, taken out for idle micro-steps.

    ``skipped`` counts the micro-steps run without them (the tests read it: the fast path
    must really be taken)."""

    def __init__(self, root: torch.nn.Module, modules: Sequence[FSDPModule]) -> None:
        self.skipped = 0
        self._root_state: Any = root._get_fsdp_state()  # type: ignore[operator]  # an FSDPModule
        self._states: list[Any] = []
        self._handles: list[Any] = []
        reason = self._collect(root, modules)
        if reason is not None:
            log.info("accumguard: FSDP2's idle micro-steps keep their hooks (%s)", reason)
            self._states, self._handles = [], []

    def _collect(self, root: torch.nn.Module, modules: Sequence[FSDPModule]) -> str | None:
        """Fill the skippable states and their hook handles; a reason when none can be."""
        if any(getattr(m, "_compiled_call_impl", None) is not None or
               type(m).__name__ == "OptimizedModule" for m in root.modules()):
            return "a module is compiled"
        for module in modules:
            state = module._get_fsdp_state()
            if state is self._root_state:
                continue
            try:
                single = len(state._modules) == 1
                mp = state._mp_policy
                groups = list(state._fsdp_param_groups)
                handles = [*_handle_parts(state._pre_forward_hook_handle),
                           *_handle_parts(state._post_forward_hook_handle)]
                params = [fp for g in groups for fp in g.fsdp_params]
            except AttributeError as exc:
                return f"torch {torch.__version__} keeps FSDP2's state elsewhere: {exc}"
            if not single or not groups:
                continue  # grouped fully_shard([a, b]) or no parameters: keep its hooks
            if mp.param_dtype is not None or mp.output_dtype is not None:
                return "a MixedPrecisionPolicy casts inputs or outputs"
            for fp in params:
                grad_dtype = getattr(fp, "param_dtype", None) or getattr(fp, "orig_dtype", None)
                if getattr(fp, "reduce_dtype", None) not in (None, grad_dtype):
                    return "a MixedPrecisionPolicy reduce_dtype upcasts the gradients"
                if getattr(fp, "offload_to_cpu", False):
                    return "parameters are offloaded to CPU"
            for h in handles:
                hooks = h.hooks_dict_ref() if callable(getattr(h, "hooks_dict_ref", None)) else None
                if hooks is None or getattr(h, "id", None) not in hooks:
                    return "a forward hook handle is not where torch 2.13 keeps it"
            self._states.append(state)
            self._handles.extend(handles)
        return None

    def disable(self) -> None:
        """Keep every hook (``skip_idle_hooks=False``, or an eager window)."""
        self._states, self._handles = [], []

    @property
    def active(self) -> bool:
        """Whether some state's hooks can be skipped at all (the tests read it)."""
        return bool(self._handles)

    def _all_idle_and_unsharded(self) -> bool:
        """Every skipped state's groups unsharded, idle, nothing pending or upcast."""
        try:
            for state in self._states:
                for g in state._fsdp_param_groups:
                    if (not g.is_unsharded or g._all_gather_result is not None
                            or getattr(g._training_state, "name", None) != "IDLE"):
                        return False
                    if any(fp.unsharded_accumulated_grad is not None for fp in g.fsdp_params):
                        return False
        except AttributeError:
            return False
        return True

    @contextlib.contextmanager
    def skipped_if(self, idle: bool) -> Iterator[None]:
        """Around one micro-step (forward and backward): without the non-root states' forward
        hooks when ``idle`` and every condition of the module doc holds; otherwise as is."""
        if not (idle and self._handles and self._all_idle_and_unsharded()):
            yield
            return
        with hooks_off(self._handles):
            self.skipped += 1
            yield

    def forget_forward_order(self) -> None:
        """Before the window's last micro-step: clear FSDP2's recorded forward order (what a
        last backward clears), so the last backward prefetches only this micro-step's
        modules. Prefetching changes when a gather runs, never the numbers."""
        try:
            order = self._root_state._comm_ctx.post_forward_order
            groups = [g for s in self._root_state._state_ctx.all_states
                      for g in s._fsdp_param_groups]
            indices = [g._post_forward_indices for g in groups]
        except AttributeError:
            return  # this torch keeps it elsewhere: FSDP2's own (one extra gather per window)
        order.clear()
        for i in indices:
            i.clear()
