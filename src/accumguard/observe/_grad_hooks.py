"""The script's ``register_post_accumulate_grad_hook`` hooks: did one rescale the accumulated
``.grad`` inside a backward?

Such a hook runs inside the backward, after the micro-batch's gradient was added to
``.grad``, so it sees the window's running sum: a per-parameter clip written there
(``if g.norm() > c: g.mul_(c / g.norm())``) clips a partial window on every micro-step, and
every measurement that brackets the backward (the conservation checksums) sees its output
only. Each such hook is wrapped when it is registered: around the script's hook, two
moments of the parameter's gradient (:mod:`._grad_moments`) are taken on its device before
and after it, and read on the host once, at the step.

The wrapper calls the script's hook once with its own argument and lets whatever it raises
through; the two measurements run behind the failsafe's hook door (label
``hook:grad_hook_moments``) and stop with observation. A hook a library registers (its
function defined in torch, DeepSpeed, Accelerate, transformers or Lightning) is not
wrapped.
"""

from __future__ import annotations

import functools

import torch

from accumguard.observe._failsafe import Maker, Original
from accumguard.observe._grad_moments import moments
from accumguard.observe._seams import PatchHost

__all__ = ["grad_hook_wrapper"]

#: Modules whose hooks are the engines' own, not the script's.
_LIBRARIES = ("torch", "deepspeed", "accelerate", "transformers", "lightning",
              "pytorch_lightning", "peft", "trl", "accumguard")


def grad_hook_wrapper(obs: PatchHost) -> Maker:
    """The patch of ``Tensor.register_post_accumulate_grad_hook``: the script's hook is
    registered wrapped (module doc)."""
    def make(orig: Original) -> Original:
        def register(tensor: torch.Tensor, hook: object, *args: object,
                     **kwargs: object) -> object:
            return orig(tensor, _measured(obs, hook), *args, **kwargs)

        return register

    return make


def _measured(obs: PatchHost, hook: object) -> object:
    fn = getattr(hook, "func", hook)  # (a functools.partial names its function's module)
    if not callable(hook) or str(getattr(fn, "__module__", "") or "").split(".")[0] \
            in _LIBRARIES:
        return hook
    before = obs.failsafe.hook(functools.partial(_before, obs), "grad_hook_moments")
    after = obs.failsafe.hook(_after, "grad_hook_moments")

    @functools.wraps(hook)
    def measured(param: torch.Tensor) -> object:
        pre = before(param) if obs.installed else None
        out = hook(param)
        if pre is not None:
            after(obs, param, pre)
        return out

    return measured


def _before(obs: PatchHost, param: torch.Tensor) -> tuple[int, torch.Tensor] | None:
    ev = obs._bw_current
    if ev is None:
        return None  # outside a backward the observer saw: not judged
    m = moments(param.grad)
    return None if m is None else (int(ev.micro), m)


def _after(obs: PatchHost, param: torch.Tensor, pre: tuple[int, torch.Tensor]) -> None:
    m = moments(param.grad)
    if m is not None and m.device == pre[1].device:
        obs._w.grad_hook_moments.append((pre[0], torch.cat([pre[1], m])))
