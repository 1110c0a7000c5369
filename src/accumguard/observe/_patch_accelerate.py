"""The observer's patches of Accelerate: ``Accelerator.backward`` (one backward pass, the
``gradient_accumulation_steps`` it declares, and its ``step`` counter, which each
``accumulate()`` block moves: how many blocks a window ran) and ``AcceleratedScheduler.step``.

Installed when ``accelerate.accelerator`` / ``accelerate.scheduler`` are imported (never
imported from here); ``obs`` is the observer (a :class:`~._seams.PatchHost`). Accelerate's optimizer wrapper needs no patch: torch's global step
hooks see the outermost step.

Under DeepSpeed, ``accelerator.backward`` runs ``engine.backward`` and then, at the
boundary (``sync_gradients``), ``engine.step()`` inside the same call. The outer call is
then not the observed backward pass: ``engine.backward`` is (patched in
:mod:`._patch_deepspeed`), so the backward ends before the engine steps and is counted in
the window it belongs to, not in the next one.
"""

from __future__ import annotations

from types import ModuleType

from accumguard.observe._failsafe import Original
from accumguard.observe._seams import PatchHost

__all__ = ["patch_accelerator", "patch_scheduler"]


def patch_accelerator(obs: PatchHost, mod: ModuleType) -> None:
    if not obs.installed:
        return

    def make_backward(orig: Original) -> Original:
        def backward(acc: object, /, loss: object, *args: object, **kwargs: object) -> object:
            if "accelerate" not in obs.frameworks:
                obs.frameworks.append("accelerate")
            k = getattr(acc, "gradient_accumulation_steps", None)
            if isinstance(k, int) and k > 1:  # 1 is the default: it declares nothing
                first = obs.declared_k.setdefault("accelerate", k)
                if obs.accelerate_k_from < 0:
                    obs.accelerate_k_from = obs.backward_total
                last = obs.k_changes[-1][1] if obs.k_changes else first
                if k != last:  # the script set acc.gradient_accumulation_steps anew (a
                    # batch-size warm-up): each window is judged against the K it ran under
                    if not obs.k_changes:
                        obs.k_changes.append([obs.accelerate_k_from, first])
                    obs.k_changes.append([obs.backward_total, k])
                    obs.k_changes_by = "the script (Accelerator.gradient_accumulation_steps)"
                state = getattr(acc, "gradient_state", None)
                if state is not None and getattr(state, "sync_with_dataloader", False):
                    obs.accelerate_loader[0 if getattr(state, "in_dataloader", True) else 1] += 1
            obs.accelerate_block(getattr(acc, "step", None))
            if getattr(acc, "deepspeed_engine_wrapped", None) is not None:
                # the engine's backward is the backward pass; its step follows it (see above)
                return orig(acc, loss, *args, **kwargs)
            return obs._run_backward("accelerate", loss, None, orig, (acc, loss, *args),
                                     kwargs)

        return backward

    obs.patches.wrap_member(mod, "Accelerator", "backward", make_backward)

    def make_init(orig: Original) -> Original:
        def init(acc: object, /, *args: object, **kwargs: object) -> object:
            out = orig(acc, *args, **kwargs)
            # K as constructed: Accelerate keeps it in a state every Accelerator shares, so a
            # second Accelerator() made later (a logging helper) resets it to 1 for all; the
            # backward then reads 1, and the script's K is known only from here
            k = getattr(acc, "gradient_accumulation_steps", None)
            if isinstance(k, int) and k > 1:
                obs.declared_k.setdefault("accelerate", k)
            return out

        return init

    obs.patches.wrap_member(mod, "Accelerator", "__init__", make_init)


def patch_scheduler(obs: PatchHost, mod: ModuleType) -> None:
    if not obs.installed:
        return

    def make(orig: Original) -> Original:
        def step(sched: object, /, *args: object, **kwargs: object) -> object:
            # Accelerate steps the wrapped scheduler once per process (by design) and
            # skips inside accumulation: one call that stepped is one scheduler step.
            obs._sched_depth += 1
            before = obs._accel_sched_inner
            try:
                return orig(sched, *args, **kwargs)
            finally:
                obs._sched_depth -= 1
                if obs._accel_sched_inner > before and obs._sched_depth == 0:
                    obs._count_sched(getattr(sched, "scheduler", sched))

        return step

    obs.patches.wrap_member(mod, "AcceleratedScheduler", "step", make)
