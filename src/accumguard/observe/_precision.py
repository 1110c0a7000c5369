"""Where a window's gradient is really summed, and in which dtype (the facts F12 needs).

The optimizer's own parameter dtype (``StepEvent.param_dtype``) says where the gradient is
summed only for a plain loop: the optimizer steps the parameters whose ``.grad`` the K
backwards added into. Three common set-ups sum elsewhere:

* **fp32 master weights behind a bf16 model**: the backwards add into the bf16 model's
  ``.grad``; the loop copies that sum to fp32 copies at the boundary and steps those. The
  optimizer sees fp32, the sum was made in bf16. Seen from the checksums the observer already
  takes of the roots' parameters: the low-precision rows the optimizer does not step, summed
  in place (nothing removed between backwards), and the optimizer's gradient at the step
  equal to that sum up to one scale (:func:`model_grad_sum`).
* **FSDP2** ``MixedPrecisionPolicy``: between micro-steps with gradient sync off, FSDP2 keeps
  the unsharded gradient in ``reduce_dtype`` (``param_dtype`` when ``reduce_dtype`` is unset
  or equal); a synced micro-step's reduced shard is added to the sharded gradient in the
  stored parameter dtype (:func:`fsdp_dtypes`).
* **DeepSpeed**: the engine sums micro-gradients in its ``gradient_accumulation_dtype``
  (``data_types.grad_accum_dtype``, default: the model dtype of ``bf16``/``fp16``)
  (:func:`deepspeed_dtypes`).

The compute dtype (bf16 parameters, FSDP2 ``param_dtype``, DeepSpeed's model dtype, an
autocast region around a root forward) is recorded too: ``accumguard invariance`` derives its
tolerance from it. Everything here is read once per owner, or per checked window from
checksums already taken; nothing touches the user's tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from accumguard.observe._checksum import checksums

if TYPE_CHECKING:
    from accumguard.observe._seams import DeepSpeedEngine

__all__ = ["LOW", "autocast_dtype", "deepspeed_dtypes", "fsdp_dtypes", "least_precise",
           "model_grad_sum", "name_of", "step_facts"]

LOW = (torch.bfloat16, torch.float16)
#: Relative tolerance of a bf16/fp16 checksum comparison (as ``tol_for`` of a low dtype).
_TOL_LOW = 3e-2
_ORDER = ("float16", "bfloat16", "float32", "float64")


def name_of(dtype: object) -> str | None:
    """``torch.bfloat16`` -> ``"bfloat16"`` (None for None)."""
    return None if dtype is None else str(dtype).replace("torch.", "")


def least_precise(names: Iterable[str | None]) -> str | None:
    """The least precise of the dtype names given (fp16 < bf16 < fp32 < fp64)."""
    seen = {n for n in names if n}
    for n in _ORDER:
        if n in seen:
            return n
    return next(iter(seen), None)


def autocast_dtype() -> str | None:
    """The autocast dtype in force right now (CUDA first, then CPU), None when off."""
    for device in ("cuda", "cpu"):
        with contextlib.suppress(Exception):
            if torch.is_autocast_enabled(device):
                return name_of(torch.get_autocast_dtype(device))
    return None


def fsdp_dtypes(groups: Sequence[object]) -> dict[str, str] | None:
    """FSDP2's dtypes over the parameter groups (the least precise of each): ``compute`` (the
    unsharded parameters, ``param_dtype``), ``deferred`` (the unsharded gradient summed over
    micro-steps with sync off: ``reduce_dtype``, else ``param_dtype``), ``reduce`` (the
    reduce-scatter) and ``synced`` (the sharded gradient a synced micro-step adds into: the
    stored dtype). None before FSDP2 set them (its lazy init, at the first forward)."""
    compute, deferred, synced = [], [], []
    for pg in groups:
        for fp in getattr(pg, "fsdp_params", None) or []:
            orig = getattr(fp, "orig_dtype", None)
            if orig is None or not getattr(fp.sharded_param, "requires_grad", False):
                continue
            param = getattr(fp, "param_dtype", None) or orig
            compute.append(name_of(param))
            deferred.append(name_of(getattr(fp, "reduce_dtype", None) or param))
            synced.append(name_of(orig))
    if not compute:
        return None
    out = {"compute": least_precise(compute), "deferred": least_precise(deferred),
           "synced": least_precise(synced)}
    return {k: v for k, v in out.items() if v is not None}


def deepspeed_dtypes(engine: DeepSpeedEngine) -> dict[str, str] | None:
    """DeepSpeed's model dtype and the dtype its optimizer sums micro-gradients in: the ZeRO
    optimizer's ``gradient_accumulation_dtype``, BF16_Optimizer's ``grad_acc_dtype``, else
    the engine's ``get_data_types()`` (``data_types.grad_accum_dtype``, default the model
    dtype)."""
    with contextlib.suppress(Exception):
        model, accum = engine.get_data_types()
        opt = getattr(engine, "optimizer", None)
        for attr in ("gradient_accumulation_dtype", "grad_acc_dtype"):
            value = getattr(opt, attr, None)
            if isinstance(value, torch.dtype):
                accum = value
                break
        out = {"compute": name_of(model), "accum": name_of(accum),
               "optimizer": type(opt).__name__ if opt is not None else "none"}
        return {k: v for k, v in out.items() if v is not None}
    return None


class MasterSum(TypedDict, total=False):
    """The master-weight pattern's sum on one checked window (:func:`model_grad_sum`)."""

    dtype: str | None  # the low-precision model parameters' dtype
    sums: int  # backwards summed into their .grad
    in_place: bool  # nothing removed between the backwards, nothing left from before
    reached: bool | None  # the optimizer's gradient is that sum up to one scale (None: unknown)
    scale: float  # that scale, when it was measured


@torch.no_grad()
def model_grad_sum(tracked: Sequence[torch.Tensor], members: Sequence[bool],
                   starts: Sequence[torch.Tensor], ends: Sequence[torch.Tensor],
                   opt_params: Sequence[torch.Tensor]) -> MasterSum | None:
    """The master-weight pattern on one checked window (an optimizer over fp32 parameters
    only): the roots' bf16/fp16 parameters the stepping optimizer does not hold (``members`` False), their ``.grad`` summed in place by
    the window's backwards (nothing removed between them, nothing left from before), and
    whether the optimizer's gradient at the step is that sum up to one scale (``reached``:
    None when the two parameter lists do not pair up by shape, so it cannot be told).

    ``starts``/``ends``: the window's checksums before/after each backward over ``tracked``
    (``[P, 3]``, rows positional; later rows may be missing from earlier checksums)."""
    if len(starts) < 2 or len(starts) != len(ends):
        return None
    if any(p.dtype in LOW for p in opt_params):
        return None  # the optimizer steps low-precision parameters itself: not masters
    n = min(int(c.shape[0]) for c in (*starts, *ends))
    rows = [i for i in range(min(n, len(members)))
            if not members[i] and tracked[i].dtype in LOW and tracked[i].numel() > 0]
    if not rows:
        return None
    idx = torch.tensor(rows)
    s = [c[idx] for c in starts]
    e = [c[idx] for c in ends]
    contrib = sum((b - a for a, b in zip(s, e, strict=True)), torch.zeros_like(s[0]))
    mass = float(contrib[:, 2].abs().sum())
    if mass <= 0:
        return None  # the backwards left nothing in .grad (moved to a buffer by a hook)
    gaps = sum(float((e[i - 1] - s[i])[:, :2].abs().sum()) for i in range(1, len(s)))
    stale = float(s[0][:, :2].abs().sum())
    in_place = gaps <= _TOL_LOW * mass and stale <= _TOL_LOW * mass
    out: MasterSum = {"dtype": least_precise(name_of(tracked[i].dtype) for i in rows),
                      "sums": len(s), "in_place": in_place, "reached": None}
    low = [tracked[i] for i in rows]
    if in_place and len(opt_params) == len(low) and all(
            tuple(p.shape) == tuple(q.shape) for p, q in zip(opt_params, low, strict=True)):
        received = checksums(opt_params)
        a = received[:, :2].reshape(-1)
        b = contrib[:, :2].reshape(-1)
        denom = float(b @ b)
        c = float(a @ b) / denom if denom > 0 else 0.0
        resid = (float((a - c * b).abs().sum())
                 / max(float(a.abs().sum()), abs(c) * float(b.abs().sum()), 1e-30))
        out["reached"] = bool(c > 0 and resid <= _TOL_LOW)
        out["scale"] = c
    return out


def step_facts(*, params: str | None, fsdp: dict[str, str] | None,
               deepspeed: dict[str, str] | None, autocast: str | None,
               model_grad: MasterSum | None) -> dict[str, Any] | None:
    """The step record's ``precision`` field: the compute dtype (the least precise of the
    roots' trainable parameters, FSDP2's ``param_dtype``, DeepSpeed's model dtype and an
    autocast region) and, when set, the FSDP2/DeepSpeed dtypes and the master-weight
    pattern's sum. None when nothing is bf16/fp16 (the record stays as it was)."""
    compute = least_precise([params, autocast, (fsdp or {}).get("compute"),
                             (deepspeed or {}).get("compute")])
    low = {"bfloat16", "float16"}
    lows = {compute, *(fsdp or {}).values(), (deepspeed or {}).get("accum")}
    if not (lows & low) and model_grad is None:
        return None
    out: dict[str, Any] = {"compute": compute}
    if autocast:
        out["autocast"] = autocast
    if fsdp:
        out["fsdp"] = fsdp
    if deepspeed:
        out["deepspeed"] = deepspeed
    if model_grad is not None:
        out["model_grad"] = model_grad
    return out
