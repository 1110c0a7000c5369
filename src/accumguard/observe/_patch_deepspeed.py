"""The observer's patches of DeepSpeed: ``DeepSpeedEngine.backward`` and ``.step``, and the
engine's configuration read once (:class:`~accumguard.observe._events.EngineInfo`).

Installed when ``deepspeed.runtime.engine`` is imported (never imported from here);
``obs`` is the observer as the :class:`~._seams.PatchHost` it is to the patches.
``engine.step`` is one optimizer step only when the engine really updated (at its
accumulation boundary, or when its ``global_steps`` moved); the backward passes before a
call that did not step are the double-gating evidence (``max_backwards_per_engine_step``,
F14). The step bookkeeping itself
(``_begin_step``/``_end_step``) stays on the observer.
"""

from __future__ import annotations

import contextlib
from types import ModuleType

import torch

from accumguard.observe._events import EngineInfo, EngineStepEvent
from accumguard.observe._failsafe import Maker, Original
from accumguard.observe._patch_torch import zero_wrapper
from accumguard.observe._seams import EngineHost, PatchHost, as_deepspeed

__all__ = ["note_engine", "patch_engine", "patch_schedules", "patch_zero_optimizer"]


def patch_engine(obs: PatchHost, mod: ModuleType) -> None:
    """Wrap the engine class of ``deepspeed.runtime.engine`` and count ``deepspeed.comm``."""
    cls = getattr(mod, "DeepSpeedEngine", None)
    if obs.installed and cls is not None:
        clip = _ClipNorm()
        obs.patches.wrap(cls, "backward", _backward_wrapper(obs))
        obs.patches.wrap(cls, "step", _step_wrapper(obs, clip))
        obs.patches.wrap(cls, "clip_fp32_gradients", _clip_wrapper(obs, clip))
        # the engine's own zero_grad (it sets every .grad to None; torch's Module.zero_grad,
        # which it overrides, is the one counted otherwise): counted as a module's
        obs.patches.wrap(cls, "zero_grad", zero_wrapper(obs, "module"))
        obs.counter.install_deepspeed()


def patch_zero_optimizer(obs: PatchHost, mod: ModuleType) -> None:
    """Count ``zero_grad`` of the ZeRO-1/2 optimizer (``deepspeed.runtime.zero.stage_1_and_2``)
    like the engine's: the optimizer ``deepspeed.initialize`` returns sets every ``.grad`` to
    None too, and a script ported from a single-process loop calls it on every micro-batch.
    (The engine's own calls inside its step are not counted: ``_ds_step_depth``.)"""
    cls = getattr(mod, "DeepSpeedZeroOptimizer", None)
    if obs.installed and cls is not None and "zero_grad" in vars(cls):
        obs.patches.wrap(cls, "zero_grad", zero_wrapper(obs, "module"))


def patch_schedules(obs: PatchHost, mod: ModuleType) -> None:
    """Count the steps of DeepSpeed's own LR schedulers (``deepspeed.runtime.lr_schedules``:
    WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest), which are no torch
    ``LRScheduler``: the engine steps the one its config names after each update, and a
    horizon (``total_num_steps``) set in micro-batches shows only here (F4). Each class that
    defines ``step`` itself is wrapped (WarmupDecayLR steps through WarmupLR's)."""
    from accumguard.observe._patch_torch import sched_wrapper
    from accumguard.observe._schedules import deepspeed_schedulers

    if not obs.installed:
        return
    for cls in deepspeed_schedulers(mod):
        obs.patches.wrap(cls, "step", sched_wrapper(obs))


class _ClipNorm:
    """The gradient norm the engine's own fp32 clip was given (ZeRO-0 without fp16/bf16:
    DeepSpeed clips there and discards the norm, so ``get_global_grad_norm()`` is None and
    the F9 rule had nothing to compare with the default clip)."""

    value: float | None = None


def _clip_wrapper(obs: PatchHost, seen: _ClipNorm) -> Maker:
    def make(orig: Original) -> Original:
        def clip_fp32_gradients(engine: torch.nn.Module, /, *args: object,
                                **kwargs: object) -> object:
            info = obs.engine_info
            # read only where the F9 rule needs it: the engine clips by its default
            if obs.installed and info is not None and not info.clipping_set_by_user:
                module = getattr(engine, "module", engine)
                with torch.no_grad():
                    norms = [torch.linalg.vector_norm(p.grad.detach().float())
                             for p in module.parameters() if p.grad is not None]
                    # after the boundary's all-reduce every rank holds the same gradient
                    seen.value = float(torch.linalg.vector_norm(torch.stack(norms))) \
                        if norms else None
            return orig(engine, *args, **kwargs)

        return clip_fp32_gradients

    return make


def note_engine(obs: EngineHost, module: torch.nn.Module) -> None:
    """The engine's ZeRO stage, GA, clipping and micro-batch, read once and emitted.

    Not guarded here: the rules that judge a DeepSpeed run (its division by GA, its
    default clip, its boundary) need these facts, so a failure to read them is accumguard's
    own failure, recorded by the door this runs behind (a forward hook or a patch), never
    a run judged without them."""
    if obs.engine_info is not None:
        return
    engine = as_deepspeed(module)
    raw = getattr(getattr(engine, "_config", None), "_param_dict", None) or {}
    managed = getattr(engine, "managed_gradient_accumulation", None)
    clip = float(engine.gradient_clipping() or 0.0)
    asked = obs.trainer_clip  # (see _patch_trainers)
    obs.engine_info = EngineInfo(
        engine="deepspeed",
        zero_stage=int(engine.zero_optimization_stage()),
        gradient_accumulation_steps=int(engine.gradient_accumulation_steps()),
        gradient_clipping=clip,
        # the HF Trainer's max_grad_norm equal to the engine's clip asked for it too
        clipping_set_by_user="gradient_clipping" in raw or asked == clip,
        requested_clipping=asked,
        managed_accumulation=bool(managed()) if callable(managed) else True,
        micro_batch=int(engine.train_micro_batch_size_per_gpu()),
        ignored_accumulation=_ignored_accumulation(raw))
    for fn in obs._handlers.on_engine:
        fn(obs.engine_info)


def _ignored_accumulation(raw: object) -> list[object] | None:
    """The config's accumulation under a key DeepSpeed does not read, read once at the
    engine's first sight (imported here: the config checks are not needed before). A failure
    of this read leaves it out (None) and keeps the rest of the engine's facts, which
    ``note_engine`` records in the same statement."""
    try:
        from accumguard.static.dsconfig import ignored_accumulation

        found = ignored_accumulation(raw) if isinstance(raw, dict) else None
    except Exception:  # noqa: BLE001 - an optional fact must not cost the engine's others
        return None
    return list(found) if found is not None else None


def _backward_wrapper(obs: PatchHost) -> Maker:
    def make(orig: Original) -> Original:
        def backward(engine: torch.nn.Module, loss: object, *args: object,
                     **kwargs: object) -> object:
            if obs._bw_depth or not obs.installed or obs._in_observer:
                return orig(engine, loss, *args, **kwargs)
            return obs._run_backward("deepspeed", loss, engine, orig, (engine, loss, *args),
                                     kwargs)

        return backward

    return make


def _step_wrapper(obs: PatchHost, clip: _ClipNorm) -> Maker:
    def make(orig: Original) -> Original:
        def step(engine: torch.nn.Module, /, *args: object, **kwargs: object) -> object:
            if not obs.installed or obs._in_observer or obs._ds_step_depth:
                return orig(engine, *args, **kwargs)
            if id(engine) not in obs.roots:
                obs._add_root(engine)
            w = obs._w
            w.engine_step_calls += 1
            # backwards since the previous engine.step(): those through engine.backward when
            # there were any (a plain penalty.backward() beside them is no micro-step of the
            # engine's), else all (a loop of plain backwards)
            since = w.engine_bw_since_step or w.bw_since_engine_step
            w.bw_since_engine_step = w.engine_bw_since_step = 0
            before = getattr(engine, "global_steps", None)
            boundary = None
            ds = as_deepspeed(engine)
            with contextlib.suppress(Exception):
                boundary = bool(ds.is_gradient_accumulation_boundary())
            managed = getattr(engine, "managed_gradient_accumulation", None)
            if callable(managed) and not managed():
                boundary = True
            fns = obs._handlers.on_engine_step
            if fns:
                ev = EngineStepEvent(obs.step, bool(boundary), since, engine)
                for fn in fns:
                    fn(ev)
            if boundary:
                obs._begin_step(_inner_optimizer(engine), True, engine=engine)
            obs._ds_step_depth += 1
            clip.value = None
            try:
                return orig(engine, *args, **kwargs)
            finally:
                obs._ds_step_depth -= 1
                after = getattr(engine, "global_steps", None)
                stepped = boundary or (before is not None and after != before)
                if not stepped:
                    # backwards before a call that did not step: the caller's boundary
                    # was not the engine's (F14 when several); the call that steps after
                    # K backwards with the boundary set (set_gradient_accumulation_boundary,
                    # as Accelerate does) is the engine's own accumulation
                    w.max_bw_per_engine_step = max(w.max_bw_per_engine_step, since)
                if stepped:
                    applied = bool(getattr(engine, "_step_applied", True))
                    norm = None
                    with contextlib.suppress(Exception):
                        n = ds.get_global_grad_norm()
                        norm = float(n) if n is not None else clip.value
                    if not boundary:
                        obs._begin_step(_inner_optimizer(engine), True, engine=engine)
                    obs._end_step("deepspeed",
                                  type(getattr(engine, "optimizer", None)).__name__,
                                  applied, norm, engine)

        return step

    return make


def _inner_optimizer(engine: torch.nn.Module) -> object:
    """The engine's ``optimizer``: a torch optimizer or one of DeepSpeed's ZeRO optimizers
    (not torch subclasses; read through ``param_groups`` only), or None."""
    return getattr(engine, "optimizer", None)
