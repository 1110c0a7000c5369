"""How far from the fp64 reference a *correct* loop can be, and the error measure itself.

The error of step s is ``‖Δθ_loop,s − Δθ_ref,s‖ / D_s`` with ``Δθ_s = θ_s − θ_0``
and ``D_s = max(‖Δθ_ref,s‖, largest single-step reference update)``: relative to
the update, so small bugs are not hidden behind large weights, and finite even
where the reference does not move (an LR of 0 at step 0 makes ``‖Δθ_ref,0‖ = 0``).

The bound follows the numerics instead of a constant:

* gradient: ``max(1e-5, 2·(K+W)·u_acc)`` — the K micro-step sums and the W-way
  reduction each round to the unit roundoff ``u_acc`` of the dtype gradients are
  accumulated in (fp32: the mission's 1e-5 dominates; bf16 weights accumulate in
  bf16);
* low-precision *compute* (autocast, bf16 working copies, FSDP2
  ``MixedPrecisionPolicy``) with fp32 accumulation: plus twice the ``floor``, the
  error of the reference itself run at that compute precision on the same data
  (measured, because the rounding of bf16 weights and activations depends on the
  model and the data, not only on ``u``);
* the update additionally carries the re-rounding of the stored weights, at most
  ``u_p·‖θ‖`` per step: ``+ 2·(s+1)·u_p·‖θ_s‖/D_s`` at step s, with ``u_p`` the
  unit roundoff of the parameter dtype. For fp32 this is what a small learning rate
  needs (SGD lr 0.1 on the toy model: ‖θ‖/‖Δθ‖ ≈ 50-500, so rounding alone
  reaches 1e-5 to 1e-4), and it stays far below the ≥ 1e-2 errors of the failure
  classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from accumguard.verify.report import Precision, Tolerance

__all__ = ["FP32_TOLERANCE", "unit_roundoff", "dtype_of", "precision_name", "build_tolerance",
           "update_errors", "update_scale", "update_tolerance", "default_tolerance"]

# fp32 target vs fp64 reference, relative to the update (mission.md).
FP32_TOLERANCE = 1e-5

_U = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8,
      torch.float16: 2.0 ** -11}
_NAMES = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16",
          torch.float16: "fp16"}
_BY_NAME = {"fp64": torch.float64, "float64": torch.float64, "fp32": torch.float32,
            "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
            "fp16": torch.float16, "float16": torch.float16}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the gap between 1 and the next representable number (fp32 default)."""
    return _U.get(dtype, _U[torch.float32])


def dtype_of(name: str | Precision) -> torch.dtype:
    """``"bf16"`` / ``"bfloat16"`` → ``torch.bfloat16``; unknown names mean fp32."""
    return _BY_NAME.get(str(name).replace("torch.", ""), torch.float32)


def precision_name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


def build_tolerance(*, compute: torch.dtype, accumulation: torch.dtype, params: torch.dtype,
                    accumulation_steps: int, world_size: int, source: str,
                    floor: Sequence[float] = ()) -> Tolerance:
    """The tolerance model for one loop (see the module docstring); ``floor[s]`` is the
    measured error at step s of the reference run at the compute precision."""
    k, w = accumulation_steps, world_size
    u_a, u_p = unit_roundoff(accumulation), unit_roundoff(params)
    grad = max(FP32_TOLERANCE, 2 * (k + w) * u_a)
    why = [f"gradient: max(1e-5, 2·(K+W)·u) = {grad:.3g} with K={k}, W={w}, "
           f"u={u_a:.3g} ({precision_name(accumulation)} accumulation)"]
    low_compute = unit_roundoff(compute) > unit_roundoff(torch.float32)
    fl = tuple(2.0 * f for f in floor) if low_compute else ()
    if fl:
        why.append(f"{precision_name(compute)} compute: + 2× the reference's own error at "
                   f"that precision (measured, max {max(fl) / 2:.3g})")
    why.append(f"update at step s: + 2·(s+1)·u·‖θ_s‖/‖Δθ_s‖ with u={u_p:.3g} "
               f"({precision_name(params)} weights re-rounded every step)")
    return Tolerance(grad=grad, weight_rounding=2 * u_p, compute=precision_name(compute),
                     accumulation=precision_name(accumulation), params=precision_name(params),
                     source=source, reason="; ".join(why), floor=fl)


def default_tolerance(dtype: torch.dtype, accumulation_steps: int,
                      world_size: int = 2) -> tuple[float, str]:
    """Gradient tolerance and its reason for a loop whose weights, compute and gradient
    accumulation are all ``dtype`` (kept for callers of the first audit API)."""
    t = build_tolerance(compute=dtype, accumulation=dtype, params=dtype,
                        accumulation_steps=accumulation_steps, world_size=world_size,
                        source="parameter dtype")
    return t.grad, t.reason


def _norm_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
               keys: Sequence[str]) -> float:
    return math.sqrt(sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in keys))


def update_scale(initial: dict[str, torch.Tensor],
                 traj: Sequence[dict[str, torch.Tensor] | None]) -> float:
    """Largest single-step update norm along ``traj`` (0 when it never moves)."""
    keys = list(initial)
    prev, best = initial, 0.0
    for p in traj:
        if p is None:
            continue
        best = max(best, _norm_diff(p, prev, keys))
        prev = p
    return best


def update_errors(initial: dict[str, torch.Tensor],
                  targets: Sequence[dict[str, torch.Tensor] | None],
                  refs: Sequence[dict[str, torch.Tensor]],
                  scale: float | None = None) -> list[float | None]:
    """Per step: ``‖Δθ_target − Δθ_ref‖ / D_s`` (module docstring); None where the target
    has no snapshot. ``scale`` overrides the reference's largest step update. When the
    reference never moves, the target's own largest step sets the scale, so a loop that
    moves where it should not reads ≥ 1, never ∞."""
    keys = list(initial)
    s = update_scale(initial, refs) if scale is None else scale
    if s == 0:
        s = update_scale(initial, targets)
    out: list[float | None] = []
    for t, r in zip(targets, refs, strict=False):
        if t is None:
            out.append(None)
            continue
        num = _norm_diff(t, r, keys)
        den = max(_norm_diff(r, initial, keys), s)
        out.append(0.0 if num == 0 else (num / den if den > 0 else math.inf))
    return out


def update_tolerance(tol: Tolerance, step: int, initial: dict[str, torch.Tensor],
                     ref: dict[str, torch.Tensor], scale: float) -> float:
    """The bound on step ``step``'s update error (module docstring)."""
    if tol.given:
        return tol.grad
    keys = list(initial)
    theta = math.sqrt(sum(float(ref[k].double().pow(2).sum()) for k in keys))
    den = max(_norm_diff(ref, initial, keys), scale)
    floor = tol.floor[step] if step < len(tol.floor) else (tol.floor[-1] if tol.floor else 0.0)
    rounding = tol.weight_rounding * (step + 1) * theta / den if den > 0 else 0.0
    return tol.grad + floor + rounding
