"""The observer's patches of torch itself: optimizer steps, backward, zero_grad, DataLoader
passes, LR schedulers, clipping, GradScaler and (``watch``) the DDP constructor.

Each function here builds or installs wrappers; the per-call work of a wrapper is its
closure body only (the same code the :class:`~accumguard.observe._observer.Observer`
used to build itself), and the bookkeeping it calls into (``_run_backward``,
``_count_sched``, ``_emit``) stays on the observer: moving the patches here adds no call
or lookup to a micro-step or a step. Collectives are patched by
:mod:`._collectives`, the loss functions by :mod:`._losses`. ``obs`` is the observer
(as the :class:`~._seams.PatchHost` it is to these patches).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import warnings
from collections.abc import Iterable
from types import ModuleType

import torch

from accumguard.observe._events import ClipEvent, ScalerEvent, ZeroGradEvent
from accumguard.observe._failsafe import Maker, Original
from accumguard.observe._grad_hooks import grad_hook_wrapper
from accumguard.observe._patch import Patches
from accumguard.observe._seams import PatchHost

__all__ = ["constructor_step", "install", "install_after_losses", "patch_compiled",
           "patch_ddp_init", "patch_fully_shard", "zero_wrapper"]

#: accumguard's own source folder: frames in it are never where a warning points
_ACCUMGUARD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"

CLIP_FUNCS = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_grads_with_norm_")
# Looked up as module globals by clip_grad_norm_ at call time: patching them also sees the
# calls made through an alias bound before install (``from torch.nn.utils import ...`` at
# the top of a script that installs the guard later).
CLIP_INNER = ("_clip_grads_with_norm_",)
#: the clipping functions that return the norm they measured
NORM_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_norm"})


def install(obs: PatchHost, p: Patches) -> None:
    """Torch's global optimizer step hooks and every torch patch but the loss functions
    and collectives (installed after these, in this order, by the observer)."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    p.add(register_optimizer_step_pre_hook(obs._opt_pre).remove)
    p.add(register_optimizer_step_post_hook(obs._opt_post).remove)
    p.wrap(torch.Tensor, "backward", _backward_wrapper(obs, "tensor"))
    p.wrap(torch.autograd, "backward", _backward_wrapper(obs, "autograd"))
    p.wrap(torch.optim.Optimizer, "__init__", _optimizer_init_wrapper(obs))
    p.wrap(torch.optim.Optimizer, "zero_grad", zero_wrapper(obs, "optimizer"))
    p.wrap(torch.optim.Optimizer, "load_state_dict", _state_load_wrapper(obs))
    p.wrap(torch.nn.Module, "zero_grad", zero_wrapper(obs, "module"))
    p.wrap(torch.utils.data.DataLoader, "__iter__", _data_pass_wrapper(obs))
    p.wrap(torch.Tensor, "register_post_accumulate_grad_hook", grad_hook_wrapper(obs))


def install_after_losses(obs: PatchHost, p: Patches) -> None:
    """LR schedulers, clipping and GradScaler (after the loss functions, as before the
    split: the undo order of the patches is unchanged)."""
    sched = torch.optim.lr_scheduler
    p.wrap(sched.LRScheduler, "step", sched_wrapper(obs))
    # torch's schedulers whose step() does not go through LRScheduler.step (SequentialLR,
    # ChainedScheduler, CosineAnnealingWarmRestarts, ReduceLROnPlateau): counted at their own
    # step, the outermost call (the schedulers a SequentialLR/ChainedScheduler steps inside
    # it are one step of it)
    for cls in list(vars(sched).values()):
        if (isinstance(cls, type) and issubclass(cls, sched.LRScheduler)
                and cls is not sched.LRScheduler and "step" in vars(cls)):
            p.wrap(cls, "step", sched_wrapper(obs))
    import torch.nn.utils as nn_utils
    import torch.nn.utils.clip_grad as clip_mod

    for mod in (clip_mod, nn_utils):
        for name in CLIP_FUNCS:
            if callable(getattr(mod, name, None)):
                p.wrap(mod, name, _clip_wrapper(obs, name))
    for name in CLIP_INNER:
        if callable(getattr(clip_mod, name, None)):
            p.wrap(clip_mod, name, _clip_wrapper(obs, "clip_grad_norm_"))
    scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_cls is not None:
        p.wrap(scaler_cls, "unscale_", _scaler_wrapper(obs, "unscale"))
        p.wrap(scaler_cls, "update", _scaler_wrapper(obs, "update"))
        p.wrap(scaler_cls, "step", _scaler_step_wrapper(obs))


def _pin_after(obs: PatchHost, *, depth: bool) -> Maker:
    """A wrapper of a call that makes a model (DDP's ``__init__``, ``fully_shard``): once the
    roots are pinned the module it was given gets the top-level pre-hook; with ``depth``
    (DDP, always a root) its depth hook too, at once (:meth:`~._forwards.ForwardHooks.
    _pin_module`). ``fully_shard`` is also called on every shard inside the root: they keep
    no depth hook, so inside the root's forward they return at the pre-hook's first test."""

    def make(orig: Original) -> Original:
        def call(module: object, /, *a: object, **kw: object) -> object:
            out = orig(module, *a, **kw)
            if depth and obs.installed and isinstance(module, torch.nn.Module):
                # DDP's reducer holds the parameters that required a gradient when it was
                # built: one frozen then and unfrozen later is never reduced
                inner = getattr(module, "module", None)
                if isinstance(inner, torch.nn.Module):
                    obs.ddp_frozen[module] = frozenset(
                        id(p) for p in inner.parameters() if not p.requires_grad)
            if obs.installed and obs.auto_roots and isinstance(module, torch.nn.Module):
                obs._pin_module(module, depth=depth)
            return out

        return call

    return make


def patch_ddp_init(obs: PatchHost, mod: ModuleType) -> None:
    """A DDP model built after the roots were pinned (:meth:`Observer._pin_roots`; e.g. a
    model rebuilt to resume from a checkpoint) gets the same top-level pre-hook, so its
    forwards and sync flag are read, not the dead first model's. Limit: the first
    model stays among the roots (its parameters tracked) until uninstall."""
    if not obs.installed:
        return

    obs.patches.wrap(mod.DistributedDataParallel, "__init__", _pin_after(obs, depth=True))
    obs.patches.wrap(mod.DistributedDataParallel, "register_comm_hook", _comm_hook_wrapper(obs))


def _comm_hook_wrapper(obs: PatchHost) -> Maker:
    """DDP's ``register_comm_hook`` given the script's hook wrapped to read, before each call,
    the sum of the bucket it is handed (this rank's own gradient, before any reduction):
    with every rank's steps the factor the hook applies to the sum over the ranks is fitted
    offline (:mod:`._hook_factor`). What the hook returns is the script's, untouched."""

    def make(orig: Original) -> Original:
        def register_comm_hook(ddp: object, /, state: object, hook: object, *a: object,
                               **kw: object) -> object:
            return orig(ddp, state, _measured_hook(obs, hook), *a, **kw)

        return register_comm_hook

    return make


def _measured_hook(obs: PatchHost, hook: object) -> object:
    if not callable(hook):
        return hook  # (DDP's own check rejects it)
    note = obs.failsafe.hook(functools.partial(_note_bucket, obs), "comm_hook")

    # (wraps: DDP reads the hook's signature, its ``bucket`` parameter and its name)
    @functools.wraps(hook)
    def measured(state: object, bucket: object) -> object:
        if obs.installed:
            note(bucket)
        return hook(state, bucket)

    return measured


def _note_bucket(obs: PatchHost, bucket: object) -> None:
    if obs._bw_current is None:
        return  # a bucket reduced outside a backward the observer saw: not judged
    buffer = getattr(bucket, "buffer", None)
    if not callable(buffer):
        return
    with torch.no_grad():
        total = buffer().detach().sum(dtype=torch.float64)  # a device read at the step only
    obs._w.hook_inputs.append((len(obs._w.backwards), total))


def patch_fully_shard(obs: PatchHost, mod: ModuleType) -> None:
    """:func:`patch_ddp_init` for FSDP2: a module given to ``fully_shard`` after the roots
    were pinned (a second model, one rebuilt) gets the top-level pre-hook, so its forwards
    and sync flag are read (before, the last flag of the first model was read for it: a
    loop deferring sync read as syncing every micro-step). Its shards inside the root are
    hooked too; called inside the root's forward they return at the first test."""
    if not obs.installed:
        return

    make = _pin_after(obs, depth=False)

    obs.patches.wrap(mod, "fully_shard", make)


def patch_compiled(obs: PatchHost, mod: ModuleType) -> None:
    """``torch.compile(module)`` warns on every call while any global module hook exists;
    until the roots are pinned (:data:`~._observer.PIN_ROOTS_AFTER_STEPS`) the observer's
    own global pre-hook is one. That warning is about accumguard, not the script: it is
    left out while ours is the only global hook (the script's stderr stays its own)."""
    from torch.nn.modules import module as module_mod

    names = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_hooks",
             "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")

    def only_ours() -> bool:
        handle = obs._global_handle
        pre = getattr(module_mod, "_global_forward_pre_hooks", None)
        return (handle is not None and isinstance(pre, dict) and list(pre) == [handle.id]
                and not any(getattr(module_mod, n, None) for n in names))

    def make(orig: Original) -> Original:
        def call(module: object, /, *args: object, **kwargs: object) -> object:
            if not obs.installed or not only_ours():
                return orig(module, *args, **kwargs)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_COMPILE_WARNING)
                return orig(module, *args, **kwargs)

        return call

    obs.patches.wrap_member(mod, "OptimizedModule", "__call__", make)


def _backward_wrapper(obs: PatchHost, source: str) -> Maker:
    def make(orig: Original) -> Original:
        def backward(tensors: object, *args: object, **kwargs: object) -> object:
            if obs._bw_depth or not obs.installed or obs._in_observer:
                return orig(tensors, *args, **kwargs)  # inside a backward: one pass
            return obs._run_backward(source, tensors, None, orig, (tensors, *args), kwargs)

        # (the door's short cut: the first test above, read before the door's bookkeeping)
        backward.passes = lambda: bool(obs._bw_depth or not obs.installed  # type: ignore[attr-defined]
                                       or obs._in_observer)
        return backward

    return make


def _optimizer_init_wrapper(obs: PatchHost) -> Maker:
    """Every torch optimizer made after the install is known from its construction on: a
    second one over other parameters gives each its own window (:mod:`._lanes`) from the
    first backward, before either has stepped, and its learning rate is traced from the
    first window (:mod:`._lr_trace`: a schedule written by hand that reaches its end in the
    first window shows there)."""
    def make(orig: Original) -> Original:
        def __init__(this: torch.optim.Optimizer, /, *args: object,  # noqa: N807
                     **kwargs: object) -> None:
            orig(this, *args, **kwargs)
            if obs.installed and not obs._in_observer:
                obs.lanes.register(this, obs.backward_total)
                obs.lanes.birth(this, obs.backward_total)
                obs.lr_trace.know(this)  # (its rate is read from the first backward on)

        return __init__

    return make


#: optimizer state loads remembered (a resume is one; a loop reloading every step is not
#: followed further)
STATE_LOADS_KEPT = 16


def _state_load_wrapper(obs: PatchHost) -> Maker:
    """``Optimizer.load_state_dict``: the optimizer step it ran at (a resume from a
    checkpoint, which claims about a resume read in the source rest on)."""
    def make(orig: Original) -> Original:
        def load_state_dict(this: torch.optim.Optimizer, /, *args: object,
                            **kwargs: object) -> object:
            out = orig(this, *args, **kwargs)
            state = getattr(this, "state", None)
            if obs.installed and not obs._in_observer \
                    and not (isinstance(state, dict) and not state) \
                    and len(obs.state_loads) < STATE_LOADS_KEPT:
                # (a state with nothing in it is no resume: Accelerate's prepare() reloads
                # a fresh optimizer's own state dict to place it on the device)
                obs.state_loads.append(obs.step)
            return out

        return load_state_dict

    return make


def zero_wrapper(obs: PatchHost, kind: str) -> Maker:
    def make(orig: Original) -> Original:
        def zero_grad(this: torch.optim.Optimizer | torch.nn.Module, /, *args: object,
                      **kwargs: object) -> object:
            if (obs._zero_depth or not obs.installed or obs._in_observer or obs._opt_depth
                    or obs._ds_step_depth):
                return orig(this, *args, **kwargs)
            w = obs._w
            if w.backwards and obs._perturbed():
                obs._restart_window()  # SAM's second pass: a new window, not F3
                w = obs._w
            fns = obs._handlers.on_zero_grad
            if fns:
                ev = ZeroGradEvent(obs.step, len(w.backwards), kind, this)
                for fn in fns:
                    fn(ev)
            if kind == "optimizer":
                obs.lanes.register(this, obs.backward_total - len(w.backwards))
            obs.lanes.on_zero(this, kind, obs.backward_total)
            if w.backwards:
                w.zero_grads += 1
                w.zero_between += 1
                w.zero_micros.append(len(w.backwards))
            obs._zero_depth += 1
            try:
                return orig(this, *args, **kwargs)
            finally:
                obs._zero_depth -= 1

        return zero_grad

    return make


def _data_pass_wrapper(obs: PatchHost) -> Maker:
    """A new pass over a DataLoader (an epoch): where it falls in the window tells a
    leftover leaking into the next epoch (F7) from a counter that is off (F13)."""

    def make(orig: Original) -> Original:
        def __iter__(loader: object) -> object:  # noqa: N807 - the wrapped dunder
            if (obs.installed and not obs._in_observer and torch.is_grad_enabled()
                    and not obs._in_data_pass):
                obs._w.data_passes.append(len(obs._w.backwards))
                if obs._pass_len is None:  # the first pass's micro-batches (observe_steps)
                    with contextlib.suppress(Exception):  # an IterableDataset has no len
                        obs._pass_len = int(len(loader))  # type: ignore[arg-type]
            obs._in_data_pass += 1  # a subclass's __iter__ calling super() is one pass
            try:
                return orig(loader)
            finally:
                obs._in_data_pass -= 1

        return __iter__

    return make


def constructor_step(sched: object) -> bool:
    """Whether a call of ``sched.step()`` is the scheduler's own initial step, made by its
    constructor (torch's ``_initial_step``; SequentialLR makes it for its first scheduler):
    never a step of the user's loop. torch marks it ``_is_initial``; before that marker the
    constructor step was the one made at ``_step_count == 0``."""
    flag = getattr(sched, "_is_initial", None)
    if isinstance(flag, bool):
        return flag
    return getattr(sched, "_step_count", 1) == 0


def sched_wrapper(obs: PatchHost) -> Maker:
    def make(orig: Original) -> Original:
        def step(sched: object, /, *args: object, **kwargs: object) -> object:
            initial = constructor_step(sched)
            if obs._sched_depth:
                obs._accel_sched_inner += 0 if initial else 1
                return orig(sched, *args, **kwargs)
            obs._sched_depth += 1
            # torch's warnings here point at the caller: re-issued there, unless a filter
            # turns warnings into errors (those must still stop the step where they arise)
            relay = True
            for f in warnings.filters:  # (a loop: a generator is a frame per filter)
                if f[0] == "error":
                    relay = False
                    break
            caught: list[warnings.WarningMessage] = []
            try:
                with warnings.catch_warnings(record=True) if relay \
                        else contextlib.nullcontext() as got:
                    if relay:
                        warnings.simplefilter("always")
                    out = orig(sched, *args, **kwargs)
                caught = list(got or [])
            finally:
                obs._sched_depth -= 1
            for w in caught:  # ("lr_scheduler.step() before optimizer.step()", ...)
                warn_at_caller(w)
            if not initial and obs.installed and not obs._in_observer:
                # an explicit epoch places the schedule (ReduceLROnPlateau's argument is a
                # metric: its calls still count)
                obs._count_sched(sched, positioned=bool(args or "epoch" in kwargs) and not isinstance(
                    sched, torch.optim.lr_scheduler.ReduceLROnPlateau))
            return out

        return step

    return make


def warn_at_caller(w: warnings.WarningMessage) -> None:
    """Re-issue a warning caught inside a wrapped call where it would have pointed without
    accumguard: torch warns with ``stacklevel=2`` (the caller of ``scheduler.step()``),
    which inside the wrappers is accumguard's own frame. The script's filters and its
    once-per-location registry apply as usual."""
    filename, lineno = w.filename, w.lineno
    frame = sys._getframe(1)
    if _ACCUMGUARD_DIR in filename:
        while frame is not None and _ACCUMGUARD_DIR in frame.f_code.co_filename:
            frame = frame.f_back  # type: ignore[assignment]
        if frame is not None:
            filename, lineno = frame.f_code.co_filename, frame.f_lineno
    glob = frame.f_globals if frame is not None else {}
    registry = glob.setdefault("__warningregistry__", {}) if frame is not None else None
    warnings.warn_explicit(w.message, w.category, filename, lineno,
                           module=glob.get("__name__"), registry=registry,
                           module_globals=glob)


def _scaler_wrapper(obs: PatchHost, kind: str) -> Maker:
    def make(orig: Original) -> Original:
        def call(scaler: object, /, *args: object, **kwargs: object) -> object:
            if obs._scaler_depth or not obs.installed or obs._in_observer:
                return orig(scaler, *args, **kwargs)
            ev = ScalerEvent(obs.step, len(obs._w.backwards), kind, scaler)
            if kind == "unscale":
                _note_unscale(obs, scaler)
                for fn in obs._handlers.on_unscale:
                    fn(ev)
            obs._scaler_depth += 1
            try:
                out = orig(scaler, *args, **kwargs)
            finally:
                obs._scaler_depth -= 1
            if kind == "update":
                for fn in obs._handlers.on_scaler_update:
                    fn(ev)
            return out

        return call

    return make


def _note_unscale(obs: PatchHost, scaler: object) -> None:
    """The window's first ``unscale_``: a norm clip before it measured the gradient times
    the loss scale (F8). The scale is read (one host read) only when such a clip ran."""
    w = obs._w
    if w.unscaled:
        return
    w.unscaled = True
    w.scaler = scaler
    if w.norm_clip is None or not getattr(scaler, "is_enabled", lambda: False)():
        return
    scale = float(scaler.get_scale())  # type: ignore[attr-defined]
    if scale != 1.0:
        w.scaled_clip = (scale, *w.norm_clip)


def _partly_scaled(obs: PatchHost, params: list[torch.Tensor], limit: object,
                   norm: object) -> None:
    """A norm clip after the window's first ``unscale_``, when its GradScaler had unscaled
    only some optimizers (one ``scaler.unscale_(opt)`` for two optimizers sharing the scaler):
    the parameters of a stepping optimizer not unscaled yet entered the clip's norm times the
    loss scale (F8). Optimizers are known from their steps (none in the first window)."""
    scaler = obs._w.scaler
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, dict) or not getattr(scaler, "is_enabled", lambda: False)():
        return
    done = {k for k, v in states.items()
            if isinstance(v, dict) and getattr(v.get("stage"), "name", "") == "UNSCALED"}
    clipped = {id(p) for p in params}
    scaled = 0
    for opt, _ in obs._opt_steps.items():
        if id(opt) not in done:
            scaled += len(clipped & {id(p) for g in getattr(opt, "param_groups", ())
                                     for p in g["params"]})
    if scaled:
        scale = float(scaler.get_scale())  # type: ignore[attr-defined]
        if scale != 1.0:
            obs._w.scaled_clip = (scale, limit, norm, scaled, len(clipped))


def _scaler_step_wrapper(obs: PatchHost) -> Maker:
    """``GradScaler.step``: when it found inf/NaN gradients it does not call the optimizer,
    and the window is over all the same (the next one starts after ``zero_grad``): ended as
    a step that applied nothing and discarded its gradients (:meth:`Observer._skipped_step`).
    Its inner ``unscale_`` is still an event (no depth counted here)."""

    def make(orig: Original) -> Original:
        def step(scaler: object, /, optimizer: torch.optim.Optimizer, *args: object,
                 **kwargs: object) -> object:
            if not obs.installed or obs._in_observer or obs._opt_depth:
                return orig(scaler, optimizer, *args, **kwargs)
            before = obs.step
            out = orig(scaler, optimizer, *args, **kwargs)
            if obs.installed and obs.step == before:  # no optimizer step ended inside
                obs._skipped_step(optimizer)
            return out

        return step

    return make


def _clip_wrapper(obs: PatchHost, name: str) -> Maker:
    def make(orig: Original) -> Original:
        def clip(parameters: torch.Tensor | Iterable[torch.Tensor], *args: object,
                 **kwargs: object) -> object:
            if (not obs.installed or obs._in_observer or obs._ds_step_depth
                    or obs._clip_depth):
                return orig(parameters, *args, **kwargs)
            limit = args[0] if args else kwargs.get("max_norm", kwargs.get("clip_value"))
            if isinstance(limit, (int, float)) and limit == math.inf:
                # max_norm/clip_value = inf changes no gradient: the idiom for reading the
                # global norm (logging), at any micro-step; not a clipping event
                obs._clip_depth += 1
                try:
                    return orig(parameters, *args, **kwargs)
                finally:
                    obs._clip_depth -= 1
            params = [parameters] if isinstance(parameters, torch.Tensor) \
                else list(parameters)
            obs.failsafe.set_args(params, *args, **kwargs)  # a generator is read once
            first = params[0] if params else None
            empty = not getattr(first, "requires_grad", False) and not any(
                isinstance(t, torch.Tensor) and (t.requires_grad or t.grad is not None)
                for t in params)
            # (a parameter first, the usual call, is read without a scan; requires_grad
            # before .grad: a tensor that requires none is a leaf, so reading its .grad warns
            # about nothing). Parameters that hold no gradient yet (FSDP2's sharded
            # parameters while their window's sync is deferred) are not clipped at all: the
            # call reads nothing and changes nothing, so it is no clipping event
            if empty or not params or (type(first) is torch.nn.Parameter
                                       and first.grad is not None) or any(
                    isinstance(t, torch.Tensor) and t.is_leaf and t.grad is not None
                    for t in params):  # (the first parameter's gradient, read without a scan)
                fns = obs._handlers.on_clip
                if fns:
                    ev = ClipEvent(obs.step, len(obs._w.backwards), name, params)
                    for fn in fns:
                        fn(ev)
                obs._w.clip_micros.append(len(obs._w.backwards))
                obs._w.clip_names.append(name)
                if empty:
                    obs._w.clip_empty.append([len(obs._w.backwards), len(params)])
            else:
                obs._w.clip_unset.append((len(obs._w.backwards), params))
            if obs.boundary is not None:
                obs.boundary.before_clip()  # (after the listeners: a rescale they ran counts)
            obs._clip_depth += 1  # the outermost clipping call is the event
            try:
                out = orig(params, *args, **kwargs)
            finally:
                obs._clip_depth -= 1
            if name in NORM_CLIPS and not obs._w.unscaled:
                obs._w.norm_clip = (limit, out)
            elif name in NORM_CLIPS and obs._w.scaler is not None and obs._w.scaled_clip is None:
                _partly_scaled(obs, params, limit, out)
            if obs.boundary is not None:
                obs.boundary.after_clip(name, limit, out)
            return out

        # (the door's short cut: the first test above; a clip nested in one is plain)
        clip.passes = lambda: bool(not obs.installed or obs._in_observer  # type: ignore[attr-defined]
                                   or obs._ds_step_depth or obs._clip_depth)
        return clip

    return make
