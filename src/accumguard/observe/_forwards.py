"""The forward side of the observer: which module is the model, and its forward hooks.

A mixin of :class:`~._observer.Observer` (its hot paths read and write the observer's
window and counters directly: one attribute lookup, no call, per forward). Two ways to find
the model:

* given roots (the guard, the framework callbacks): hooks on those modules, added and
  removed per window by ``sampled_records`` (:meth:`ForwardHooks._hook_roots`); with
  ``attribute``, each root's output is handed to :class:`~._attribution.Attribution`;
* ``auto_roots`` (``watch``): a global forward pre-hook treats the outermost module call as
  the model, then is swapped for pre-hooks on the modules seen at the top level
  (:meth:`ForwardHooks._pin_roots`).

At each root forward the DDP ``require_backward_grad_sync`` / FSDP2 ``reduce_grads`` flag is
read (:meth:`ForwardHooks._sync_flag`): the sync contract of the window's last micro-step.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from accumguard.observe import _patch_deepspeed
from accumguard.observe._events import BackwardEvent, ForwardEvent
from accumguard.observe._failsafe import hook_method
from accumguard.observe._hookref import ModuleHook
from accumguard.observe._introspect import WRAPPERS, engine_kind, engine_module, fsdp_param_groups
from accumguard.observe._precision import autocast_dtype

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from accumguard.observe._attribution import Attribution
    from accumguard.observe._events import EngineInfo, Handlers
    from accumguard.observe._window import StepTally

__all__ = ["ForwardHooks"]


class ForwardHooks:
    """Root bookkeeping and forward hooks (state: the observer's ``roots``, ``_sync_roots``,
    ``_given_roots``, ``_root_handles``, ``_depth_hooked``/``_hooked_ids``/``_fwd_depth``,
    ``_global_handle``/``_pinned``, ``_tracked*``, set up in ``Observer.__init__``)."""

    # (attributes of the observer this mixin uses; typed here for readers and checkers)
    roots: dict[int, torch.nn.Module]
    engine_info: EngineInfo | None
    trainer_clip: float | None
    engine: str
    step: int
    installed: bool
    attribute: bool
    _in_observer: int
    _w: StepTally
    _handlers: Handlers
    _attribution: Attribution
    _sync_roots: list[torch.nn.Module]
    _given_roots: list[torch.nn.Module]
    _root_handles: list[RemovableHandle]
    _depth_hooked: weakref.WeakKeyDictionary[torch.nn.Module, RemovableHandle]
    _hooked_ids: set[int]
    _fwd_depth: int
    _global_handle: RemovableHandle | None
    _pinned: list[RemovableHandle]
    _pinned_any: bool
    _ds_engine: torch.nn.Module | None  # DeepSpeed's engine (an nn.Module)
    _tracked: list[torch.Tensor]
    _tracked_ids: set[int]
    _tracked_names: dict[int, str]
    _fsdp_groups: dict[int, list[object]]  # FSDP2 root -> its param groups
    _last_sync_forward: bool | None
    _sync_root: torch.nn.Module | None
    _bw_current: BackwardEvent | None

    if TYPE_CHECKING:  # defined by the observer
        def _active(self) -> bool: ...
        def _quiet(self) -> contextlib.AbstractContextManager[None]: ...

    def _add_root(self, module: torch.nn.Module) -> None:
        if id(module) in self.roots:
            return
        self.roots[id(module)] = module
        module = engine_module(module)  # a compiled or Fabric model's engine is its inner one's
        self.roots[id(module)] = module
        kind = engine_kind(module)
        if kind != "local" and (self.engine in ("local", "zero1") or (
                kind in ("ddp", "fsdp2") and self.engine in ("ddp", "fsdp2"))):
            # a DDP/FSDP2 model built after another (a second model, one rebuilt on the
            # other engine) is the engine of the steps from its first forward on: an FSDP2
            # step read as DDP has its shards' checksums compared across ranks
            self.engine = kind
        if kind in ("ddp", "fsdp2"):
            self._sync_roots.append(module)
        if kind == "deepspeed":
            self._ds_engine = module
            _patch_deepspeed.note_engine(self, module)
        with self._quiet():
            self._track(module)
        if kind == "fsdp2":
            self._fsdp_groups[id(module)] = fsdp_param_groups(module)

    def _track(self, module: torch.nn.Module) -> set[int]:
        """Track the parameters of root ``module`` that require a gradient and are not tracked
        yet (the checksummed ones; called again at checked steps: a parameter replaced or
        unfrozen since is tracked from the next window). Returns the ids of all its
        parameters."""
        base = getattr(module, "module", module) if engine_kind(module) == "deepspeed" \
            else module
        seen: set[int] = set()
        for name, prm in base.named_parameters():
            seen.add(id(prm))
            if prm.requires_grad and id(prm) not in self._tracked_ids:
                self._tracked_ids.add(id(prm))
                self._tracked.append(prm)
                self._tracked_names[id(prm)] = name
        return seen

    def _sync_flag(self, module: torch.nn.Module) -> bool | None:
        """The flag of the DDP/FSDP2 ``module`` (callers unwrap compile and Fabric)."""
        kind = engine_kind(module)
        if kind == "ddp":
            return bool(getattr(module, "require_backward_grad_sync", True))
        if kind == "fsdp2":
            groups = self._fsdp_groups.get(id(module)) or []
            flags = [bool(getattr(g, "reduce_grads", True)) for g in groups]
            return all(flags) if flags else None
        return None

    @hook_method
    def _root_pre(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        self._attribution.forward_begins()
        if self.installed and not self._in_observer and torch.is_grad_enabled():
            if module in self._sync_roots or (type(module).__name__ in WRAPPERS
                                              and engine_module(module) in self._sync_roots):
                self._on_forward(module)
                return
            # _on_forward for a root without a sync flag, inlined (every micro-step)
            self._last_sync_forward = None
            w = self._w
            w.forwards += 1
            if not w.autocast_read:  # once per window: the compute dtype (F12, invariance)
                w.autocast_read, w.autocast = True, autocast_dtype()
            fns = self._handlers.on_forward
            if fns:
                ev = ForwardEvent(self.step, len(self._w.backwards), engine_kind(module), None,
                                  module)
                for fn in fns:
                    fn(ev)

    @hook_method
    def _root_forward_and_post(self, module: torch.nn.Module, args: tuple[object, ...],
                               output: object) -> None:
        """A root without a gradient-sync flag, with attribution: the forward is counted
        when it returns (nothing is read before it runs), then attributed."""
        if not self.installed or self._in_observer or not torch.is_grad_enabled():
            return
        # _on_forward for a root without a sync flag, inlined (this runs every micro-step)
        self._last_sync_forward = None
        self._w.forwards += 1
        fns = self._handlers.on_forward
        if fns:
            ev = ForwardEvent(self.step, len(self._w.backwards), engine_kind(module), None,
                              module)
            for fn in fns:
                fn(ev)
        self._attribution.note_output(output)

    @hook_method
    def _root_post(self, module: torch.nn.Module, args: tuple[object, ...],
                   output: object) -> None:
        if self.installed and not self._in_observer and torch.is_grad_enabled():
            self._attribution.note_output(output)

    @hook_method
    def _reach(self, grad_outputs: object) -> None:
        """Attribution's fallback pre-hook fired: the running backward reached a root."""
        ev = self._bw_current
        if ev is not None and self.installed:
            ev.reached = True

    @hook_method
    def _global_pre(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        """Every module call. A call at depth 0 is a top-level forward (a root); only the
        modules ever called at the top level carry a depth-counting post hook, so a
        submodule's call costs one set lookup (the former global post hook with
        ``always_call`` ran on every submodule call)."""
        if self._fwd_depth and id(module) not in self._hooked_ids:
            return  # inside a top-level forward, not a module seen at the top level
        if id(module) not in self._hooked_ids and torch.compiler.is_compiling():
            # a module first met while Dynamo traces a compiled function: registering its
            # depth hook would be a graph break, which fullgraph=True raises into the
            # user's code. Its forwards are not counted (their backwards still are); a
            # module met first outside (torch.compile(model) is called outside) is hooked.
            return
        if not self._fwd_depth and torch._C._current_autograd_node() is not None:
            # a forward run by the backward pass (activation checkpointing's recompute, a
            # hook's module call): not a forward of the window, not a root
            return
        # (ids are reused: the weak map decides; but not while Dynamo traces this hook: the
        # map holds compiled wrappers whose inner module Dynamo may be tracing already, and
        # rebuilding them raised an AssertionError into the user's code (blind round 36
        # a_c03). There a module's id among the hooked ones is taken as it.)
        if torch.compiler.is_compiling():
            self._enter_module(module, True)
        elif (_GET_CALLBACK() is not None if _GET_CALLBACK is not None
              else "torch._dynamo" in sys.modules):
            # eager code between compiled regions may still run under Dynamo's frame
            # callback, which then compiles every Python frame the bookkeeping calls (the
            # weak map's lookup failed there: blind round 42 b_c03, a compiled DDP model)
            _eager_enter_without_dynamo()(self, module)
        else:
            self._enter_module(module, module in self._depth_hooked)

    def _enter_module(self, module: torch.nn.Module, hooked: bool) -> None:
        """A module call at depth 0, or of a module seen there: count the depth, and at depth
        0 take it as a root (``hooked``: its depth hook is in place)."""
        if self._fwd_depth and not hooked:
            return
        if not hooked:
            self._depth_hooked[module] = module.register_forward_hook(ModuleHook(self._depth_post),
                                                                      always_call=True)
            self._hooked_ids.add(id(module))
        self._fwd_depth += 1
        if self._fwd_depth == 1 and self._active() and torch.is_grad_enabled():
            self._add_root(module)
            self._on_forward(module)

    def _pin_roots(self) -> None:
        """Swap the global pre-hook for the same hook on each module seen at the top level
        so far. Limit (documented): a module first called at the top level after this is
        not seen (its forwards uncounted; its backwards, steps and collectives still are)."""
        assert self._global_handle is not None
        self._global_handle.remove()
        self._global_handle = None
        self._pinned = [m.register_forward_pre_hook(ModuleHook(self._global_pre))
                        for m in list(self._depth_hooked.keys())]
        self._pinned_any = True

    def _pin_module(self, module: torch.nn.Module, *, depth: bool) -> None:
        """A DDP/FSDP2 model just made (DDP's ``__init__``, ``fully_shard``): its pre-hook once
        the roots are pinned (before, the global pre-hook sees its forwards), and with
        ``depth`` its depth hook now, outside any compiled function (a function
        ``torch.compile`` traces may call it first, where the registration would be a graph
        break that fullgraph=True raises)."""
        if self._global_handle is None and self._pinned_any:
            self._pinned.append(module.register_forward_pre_hook(ModuleHook(self._global_pre)))
        if depth and module not in self._depth_hooked:
            self._depth_hooked[module] = module.register_forward_hook(ModuleHook(self._depth_post),
                                                                      always_call=True)
            self._hooked_ids.add(id(module))

    def _hook_roots(self, on: bool) -> None:
        """Add (remove) the forward hooks on the given roots. Unarmed windows of
        ``sampled_records`` run without them: a hooked module call takes torch's slower
        call path, about 18 us per forward on the demo LM (half the callbacks' cost on
        the steps they do not check)."""
        for handle in self._root_handles:
            handle.remove()
        self._root_handles = []
        if not on:
            return
        for m in self._given_roots:
            if self.attribute and engine_kind(m) not in ("ddp", "fsdp2"):
                # no sync flag to read before the forward: one hook after it does both
                # (a hooked module call costs a slower call path per hook kind)
                self._root_handles.append(m.register_forward_hook(ModuleHook(self._root_forward_and_post)))
                continue
            self._root_handles.append(m.register_forward_pre_hook(ModuleHook(self._root_pre)))
            if self.attribute:
                self._root_handles.append(m.register_forward_hook(ModuleHook(self._root_post)))

    def _remove_root_hooks(self) -> None:
        if self._global_handle is not None:
            self._global_handle.remove()
            self._global_handle = None
        for handle in self._pinned:
            handle.remove()
        self._pinned = []

    @hook_method
    def _depth_post(self, module: torch.nn.Module, args: tuple[object, ...],
                    output: object) -> None:
        if self._fwd_depth:
            self._fwd_depth -= 1

    def _on_forward(self, module: torch.nn.Module) -> None:
        if type(module).__name__ in WRAPPERS:  # DDP's reducer, not a compile/Fabric wrapper's
            module = engine_module(module)
        sync = self._sync_flag(module)
        self._last_sync_forward = sync
        if sync is not None:  # the root whose flag the next backward reads (a model
            self._sync_root = module  # rebuilt mid-run leaves a dead root in _sync_roots)
        w = self._w
        w.forwards += 1
        if not w.autocast_read:  # once per window: the compute dtype (F12, invariance)
            w.autocast_read, w.autocast = True, autocast_dtype()
        fns = self._handlers.on_forward
        if fns:
            ev = ForwardEvent(self.step, len(self._w.backwards), engine_kind(module), sync,
                              module)
            for fn in fns:
                fn(ev)


_EAGER_ENTER: Callable[[ForwardHooks, torch.nn.Module], None] | None = None
#: Dynamo's frame callback, read in C (no Python frame per call). Set outside a trace, it
#: means eager code between compiled regions. Where torch lacks the getter, Dynamo being
#: loaded is taken as "it may be set".
_GET_CALLBACK: Callable[[], object] | None = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None), "get_eval_frame_callback", None)



def _eager_enter(seams: ForwardHooks, module: torch.nn.Module) -> None:
    seams._enter_module(module, module in seams._depth_hooked)


def _eager_enter_without_dynamo() -> Callable[[ForwardHooks, torch.nn.Module], None]:
    """:func:`_eager_enter` with Dynamo's frame callback off while it runs (made once, when
    Dynamo is loaded: ``torch.compiler.disable`` changes nothing a compiled graph holds, as
    it only ever runs here, outside any trace)."""
    global _EAGER_ENTER
    if _EAGER_ENTER is None:
        _EAGER_ENTER = torch.compiler.disable(_eager_enter, recursive=True)  # type: ignore[no-untyped-call]
    return _EAGER_ENTER
