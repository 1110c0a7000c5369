"""The observer's patches of the trainers whose configuration declares K: Hugging Face
``TrainingArguments`` and Lightning's ``Trainer`` (both packages' names), and the K that
Lightning's ``GradientAccumulationScheduler`` sets per epoch.

Installed when their modules are imported (never imported from here); ``obs`` is the
observer (a :class:`~._seams.PatchHost`). Each constructor
is wrapped to read the accumulation steps the user configured into
``Observer.declared_k``: the F1 rules judge against a declared K, never an inferred one.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from accumguard.observe._failsafe import Original
from accumguard.observe._seams import PatchHost

__all__ = ["patch_hf_args", "patch_lightning", "patch_lightning_k_schedule"]


def patch_hf_args(obs: PatchHost, mod: ModuleType) -> None:
    _declares_k(obs, mod, "TrainingArguments", "__post_init__", "gradient_accumulation_steps",
                "transformers", also=_note_clip)


def _note_clip(obs: PatchHost, args: object) -> None:
    """The clipping the Trainer asks for (``max_grad_norm``; 0 is none). Under DeepSpeed the
    Trainer does not clip itself: the engine's ``gradient_clipping`` does (the F9 rule reads
    this to tell the clipping the user asked for from DeepSpeed's default)."""
    clip = getattr(args, "max_grad_norm", None)
    if isinstance(clip, (int, float)) and not isinstance(clip, bool):
        obs.trainer_clip = float(clip)


def patch_lightning(obs: PatchHost, mod: ModuleType) -> None:
    # Lightning's default 1 declares nothing: under manual optimisation the module
    # accumulates itself (Lightning refuses any other value there).
    _declares_k(obs, mod, "Trainer", "__init__", "accumulate_grad_batches", "lightning")


def patch_lightning_k_schedule(obs: PatchHost, mod: ModuleType) -> None:
    """Lightning's ``GradientAccumulationScheduler`` sets ``trainer.accumulate_grad_batches``
    at each epoch's start (K per epoch): note each K it sets with the backward count it
    starts from (once per epoch, never on the hot path), so that each window is judged
    against the K Lightning used for it."""
    if not obs.installed:
        return

    def make(orig: Original) -> Original:
        def on_train_epoch_start(this: object, trainer: object, /, *a: object, **kw: object) -> object:
            out = orig(this, trainer, *a, **kw)
            k = getattr(trainer, "accumulate_grad_batches", None)
            if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
                obs.k_changes.append([obs.backward_total, k])
                obs.k_changes_by = "Lightning's GradientAccumulationScheduler"
                if "lightning" not in obs.frameworks:
                    obs.frameworks.append("lightning")
            return out

        return on_train_epoch_start

    obs.patches.wrap_member(mod, "GradientAccumulationScheduler", "on_train_epoch_start", make)


def _declares_k(obs: PatchHost, mod: ModuleType, cls_name: str, method: str, attr: str,
                library: str, also: Callable[[PatchHost, object], None] | None = None) -> None:
    """Wrap ``mod.cls_name.method`` (a constructor) to record ``instance.attr`` as
    ``library``'s K (and run ``also(obs, instance)``)."""
    if not obs.installed:
        return

    def make(orig: Original) -> Original:
        def init(this: object, /, *a: object, **kw: object) -> object:
            out = orig(this, *a, **kw)
            if library not in obs.frameworks:
                obs.frameworks.append(library)
            k = getattr(this, attr, None)
            if isinstance(k, int) and k > 1:  # 1 is the default: it declares nothing
                obs.declared_k[library] = k
            if also is not None:
                also(obs, this)
            return out

        return init

    obs.patches.wrap_member(mod, cls_name, method, make)
