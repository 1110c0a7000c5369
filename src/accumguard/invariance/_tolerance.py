"""``accumguard invariance``: how far apart two runs of a *correct* script may be, from the
dtypes and K the recordings show, with the audit's model (:mod:`accumguard.verify.tolerance`).

A correct loop sums its micro-gradients in fp32 whatever its compute precision, so the bound
is that of fp32 accumulation at the recorded compute dtype:

* fp32 compute and weights: :data:`FP32_TOLERANCE` (two fp32 runs add the same numbers in a
  different order, and the difference compounds over a few steps);
* bf16/fp16 compute (bf16 parameters, autocast, FSDP2 ``param_dtype``, DeepSpeed ``bf16``):
  plus twice the compute precision's floor, the floor being one unit roundoff u_c (the error
  of a correct bf16 loop against the exact gradient, measured 3.7e-3 = 0.95 u for bf16 at
  every K from 4 to 512; the audit measures it per model, invariance cannot run a reference);
* bf16/fp16 *weights* (the optimizer steps them): plus the re-rounding of the weights,
  ``2·(s+1)·u_p·‖θ_s‖/‖Δθ_ref,s‖`` at step s (an update smaller than a weight's ulp is
  rounded away, differently in each run).

A run whose window is summed in bf16 (F12) is *not* within this bound once its drift
``u·sqrt(K)/3`` passes it (bf16: K > 36); that is the point: invariance reports it, and the
watch findings attached to the run name where the sum was made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from accumguard.invariance._records import RunRecord

__all__ = ["FP32_TOLERANCE", "InvarianceTolerance", "derive_tolerance", "invariance_tolerance"]

# fp32: two fp32 runs that add the same numbers in different orders (K partial sums,
# the ranks' reduction) each sit within a few 1e-7 of the exact update; over a few
# steps the difference compounds through the weights. 1e-4 (about 800 fp32 units of
# roundoff) leaves that headroom while every accumulation bug we know of moves the
# update by 1e-2 or more.
FP32_TOLERANCE = 1e-4
_U32 = 2.0 ** -24  # fp32 unit roundoff (torch is imported only when a bound is derived)


@dataclass(frozen=True)
class InvarianceTolerance:
    """The bound on a step's relative update difference: ``base`` plus, for low-precision
    weights, ``weight_rounding·(s+1)·‖θ_s‖/‖Δθ_ref,s‖``."""

    base: float
    weight_rounding: float
    reason: str

    def at(self, position: int, theta: float | None, update_norm: float | None) -> float:
        """The bound at the ``position``-th compared step (0-based)."""
        if self.weight_rounding <= 0 or not theta or not update_norm:
            return self.base
        return self.base + self.weight_rounding * (position + 1) * theta / update_norm


def _least(names: Sequence[str | None]) -> str | None:
    for n in ("float16", "bfloat16", "float32", "float64"):
        if n in names:
            return n
    return next((n for n in names if n), None)


def derive_tolerance(runs: Sequence[RunRecord]) -> InvarianceTolerance:
    """The bound for these runs (module docstring): compute and weight dtypes as recorded
    (the least precise over the runs), K the largest of the runs, W their world size."""
    params = _least([r.param_dtype for r in runs])
    compute = _least([r.compute_dtype or r.param_dtype for r in runs])
    return _model(compute, params, max((r.k for r in runs), default=1),
                  max((r.world_size for r in runs), default=1))


def _model(compute: str | None, params: str | None, k: int, world: int
           ) -> InvarianceTolerance:
    import torch  # lazily: reading a report (the CLI's --help, JSON) needs no torch

    from accumguard.verify.tolerance import (
        build_tolerance,
        dtype_of,
        precision_name,
        unit_roundoff,
    )

    if compute is None and params is None:
        return InvarianceTolerance(FP32_TOLERANCE, 0.0, "parameter dtype not recorded, assumed "
                                   "float32: 1e-4; pass --tolerance for bf16/fp16 training")
    c, p = dtype_of(compute or "float32"), dtype_of(params or "float32")
    u_c, u_p = unit_roundoff(c), unit_roundoff(p)
    if u_c <= _U32 and u_p <= _U32:
        name = params or "float32"
        return InvarianceTolerance(FP32_TOLERANCE, 0.0, f"{name} parameters: 1e-4, fp32 sums "
                                   "in a different order")
    # the audit's model for a correct loop (fp32 accumulation) at this compute precision,
    # with the floor estimated as one unit roundoff of the compute dtype
    tol = build_tolerance(compute=c, accumulation=torch.float32, params=p,
                          accumulation_steps=k, world_size=max(1, world),
                          source="recorded dtypes", floor=(u_c,) if u_c > _U32 else ())
    base = max(FP32_TOLERANCE, tol.grad) + (tol.floor[0] if tol.floor else 0.0)
    rounding = tol.weight_rounding if u_p > _U32 else 0.0
    why = [f"{precision_name(c)} compute, {precision_name(p)} weights, K={k}: the bound of a "
           f"correct loop (fp32 accumulation) as the audit derives it: {base:.3g}"]
    if u_c > _U32:
        why.append(f"= 1e-4 + 2·u ({precision_name(c)} floor, u={u_c:.3g})")
    if rounding:
        why.append(f"+ 2·(s+1)·u·‖θ‖/‖Δθ‖ at step s ({precision_name(p)} weights re-rounded, "
                   f"u={u_p:.3g})")
    why.append("a window summed in bf16/fp16 drifts by about u·sqrt(K)/3 beyond it")
    return InvarianceTolerance(base, rounding, "; ".join(why))


def invariance_tolerance(dtype: str | None, k_max: int) -> tuple[float, str]:
    """The base bound and its reason for a run whose weights and compute are ``dtype``
    (the first API; :func:`derive_tolerance` reads the compute dtype from the recording)."""
    name = (dtype or "").replace("torch.", "") or None
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "double": "float64",
               "float": "float32", "fp32": "float32"}
    name = aliases.get(name or "", name)
    t = _model(name, name, k_max, 2)
    return t.base, t.reason
