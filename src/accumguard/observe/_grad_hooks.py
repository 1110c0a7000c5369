"""The script's ``register_post_accumulate_grad_hook`` hooks: did one rescale the accumulated
``.grad`` inside a backward?

Such a hook runs inside the backward, after the micro-batch's gradient was added to
``.grad``, so it sees the window's running sum: a per-parameter clip written there
(``if g.norm() > c: g.mul_(c / g.norm())``) clips a partial window on every micro-step, and
every measurement that brackets the backward (the conservation checksums) sees its output
only. Each such hook is wrapped when it is registered: around the script's hook, two
moments of the parameter's gradient, ``||g||_2`` and ``||g||_4`` in float64, are taken
on its device before and after it (read on the host once, at the step). A hook that
multiplied ``.grad`` by a scalar ``c`` moves both by exactly ``|c|``; one that did anything
else (an all-reduce, a clamp) moves them apart, and is not read as a rescale.

The wrapper calls the script's hook once with its own argument and lets whatever it raises
through; the two measurements run behind the failsafe's hook door (label
``hook:grad_hook_moments``) and stop with observation. A hook a library registers (its
function defined in torch, DeepSpeed, Accelerate, transformers or Lightning) is not
wrapped.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from accumguard.observe._failsafe import Maker, Original
from accumguard.observe._seams import PatchHost

__all__ = ["SCALAR_TOL", "grad_hook_wrapper", "rescaled"]

#: Relative agreement of the two moments' ratios under which the change was one scalar (a
#: float32 product re-rounded: ~1e-7), and the distance from 1 that is a rescale.
SCALAR_TOL = 1e-5
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
    if not callable(hook) or str(getattr(hook, "__module__", "") or "").split(".")[0] \
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


def _moments(g: object) -> torch.Tensor | None:
    if not isinstance(g, torch.Tensor):
        return None
    to_local = getattr(g, "to_local", None)  # an FSDP2 DTensor: this rank's shard
    f = to_local() if callable(to_local) and type(g) is not torch.Tensor else g
    if f.layout != torch.strided or f.numel() == 0 or not f.is_floating_point():
        return None  # (a sparse, empty, complex or integer gradient: not read)
    with torch.no_grad():
        return torch.stack([torch.linalg.vector_norm(f, 2, dtype=torch.float64),
                            torch.linalg.vector_norm(f, 4, dtype=torch.float64)])


def _before(obs: PatchHost, param: torch.Tensor) -> tuple[int, torch.Tensor] | None:
    ev = obs._bw_current
    if ev is None:
        return None  # outside a backward the observer saw: not judged
    m = _moments(param.grad)
    return None if m is None else (int(ev.micro), m)


def _after(obs: PatchHost, param: torch.Tensor, pre: tuple[int, torch.Tensor]) -> None:
    m = _moments(param.grad)
    if m is not None and m.device == pre[1].device:
        obs._w.grad_hook_moments.append((pre[0], torch.cat([pre[1], m])))


def rescaled(moments: list[tuple[int, torch.Tensor]]) -> list[list[float]] | None:
    """Per backward pass in which a hook rescaled some parameter's ``.grad``: [the pass
    (0-based), parameters rescaled, parameters measured in it, smallest factor, largest];
    None when no hook rescaled any. One host read for the window."""
    if not moments:
        return None
    try:
        rows = torch.stack([t for _, t in moments]).tolist()
    except RuntimeError:  # gradients on several devices: one read each
        rows = [t.tolist() for _, t in moments]
    per: dict[int, list[Any]] = {}
    for (b, _), (n2, n4, a2, a4) in zip(moments, rows, strict=True):
        row = per.setdefault(b, [b, 0, 0, None, None])
        row[2] += 1
        if not (n2 > 0 and n4 > 0):
            continue
        c2, c4 = a2 / n2, a4 / n4
        if c2 <= SCALAR_TOL or abs(c2 - c4) > SCALAR_TOL * max(c2, c4) \
                or abs(c2 - 1.0) <= SCALAR_TOL:
            continue  # cleared (an optimizer stepped in the hook), not one scalar, or none
        row[1] += 1
        row[3] = c2 if row[3] is None else min(row[3], c2)
        row[4] = c2 if row[4] is None else max(row[4], c2)
    out = [[float(x) for x in r] for r in per.values() if r[1]]
    return out or None
