"""The scale a loop applies to the accumulated gradient at the boundary, measured.

Between a window's last backward and the optimizer step a loop may multiply the gradient by
one number: a GradScaler's unscale, an exact path's ``W/N`` (accumguard's own, or one
written by hand: sum the token losses, then ``p.grad *= W / N`` before the step). What the
optimizer receives is then the backward's token weights times that number; the token-weight
probe reads only the former. :class:`BoundaryScale` measures the number on one parameter
(the logits layer's weight, whose gradient is built from the probed dL/dlogits): a sample of
its gradient after each backward and again at the first clip after the last backward (a
clip's own factor is not the loop's normalisation) or at the step.

Two functionals of the sample: ``Σ|g|`` gives the scale ``c``; a fixed ±1 projection
``Σ r·g`` must scale by the same ``c`` (to ``1e-4`` of ``Σ|g|``, wider for bf16/fp16
rounding), else the gradient was changed by something that is not one scale (a hand-written
all-reduce, weight decay added to the gradient): :data:`MIXED`, and the token weights cannot
be read. A norm clip's own factor (from its returned norm) is divided out of a measurement
taken at the step, so a rescale after a clip is seen too. At most ``_SAMPLE`` strided
elements are read: a few reductions per checked backward, no copy of the gradient.
"""

from __future__ import annotations

import math

import torch

from accumguard.observe._introspect import local

__all__ = ["MIXED", "BoundaryScale"]

_SAMPLE = 1 << 16
_UNIFORM_TOL = 1e-4
#: :meth:`BoundaryScale.scale` when the gradient changed by more than one scale.
MIXED = math.nan


class BoundaryScale:
    """The boundary scale of one parameter's gradient, per window (see the module)."""

    def __init__(self, param: torch.Tensor) -> None:
        self.param = param
        self._signs: dict[tuple[int, torch.device], torch.Tensor] = {}
        self.reset()

    def reset(self) -> None:
        """A new window: nothing measured."""
        self._end: torch.Tensor | None = None
        self._at: torch.Tensor | None = None
        self._clip: float | None = 1.0  # product of the boundary norm clips' factors
        self._tol = _UNIFORM_TOL

    def after_backward(self) -> None:
        self._end = self._measure()
        self._at = None
        self._clip = 1.0

    def before_clip(self) -> None:
        if self._end is not None and self._at is None:
            self._at = self._measure()

    def after_clip(self, function: str, max_norm: object, total: object) -> None:
        """A clip after the last backward returned: its factor (a norm clip's
        ``min(1, max_norm / (total + 1e-6))``, torch's formula) is divided out of the scale;
        any other clip (by value) is not one factor."""
        if self._end is None or self._clip is None:
            return
        factor = None
        if "norm" in function and isinstance(max_norm, (int, float)) \
                and isinstance(total, torch.Tensor):
            full = getattr(total, "full_tensor", None)  # FSDP2: a DTensor norm
            t = float(full() if callable(full) else total)
            if math.isfinite(t):
                factor = min(1.0, float(max_norm) / (t + 1e-6))
        self._clip = None if factor is None else self._clip * factor

    def scale(self) -> float | None:
        """``c`` with received = c × accumulated (on the sampled parameter), clips excluded;
        None: no checked backward in this window or no gradient; :data:`MIXED` (nan): the
        gradient changed by more than one scale."""
        if self._end is None:
            return None
        now = self._measure()
        if now is None:
            return None
        c = self._ratio(self._end, now)
        if c is None:
            return None
        if self._clip is not None and self._clip > 0 and not math.isnan(c):
            return c / self._clip  # at the step, the known clip factors divided out
        if self._at is not None:  # before the first clip (a clip by value: not one scale)
            c = self._ratio(self._end, self._at)
            return None if c is None else c
        return MIXED

    def _ratio(self, end: torch.Tensor, at: torch.Tensor) -> float | None:
        """The one scale from ``end`` to ``at``, :data:`MIXED` if not one, None if empty."""
        (a0, p0), (a1, p1) = end.tolist(), at.tolist()
        if not (math.isfinite(a0) and math.isfinite(a1)) or not (a0 > 0.0 and a1 > 0.0):
            return None  # no gradient mass, or inf/NaN (a step the scaler skips)
        c = a1 / a0
        return c if abs(p1 - c * p0) <= self._tol * a1 else MIXED

    @torch.no_grad()
    def _measure(self) -> torch.Tensor | None:
        g = self.param.grad
        if g is None:
            return None
        flat = local(g).detach().reshape(-1)
        n = flat.numel()
        if n == 0:
            return None
        sample = flat[:: max(1, n // _SAMPLE)]
        if sample.dtype in (torch.float16, torch.bfloat16):  # rounding of one exact scale
            self._tol = max(_UNIFORM_TOL,
                            4 * torch.finfo(sample.dtype).eps / math.sqrt(sample.numel()))
        sample = sample.float()
        key = (sample.numel(), sample.device)
        signs = self._signs.get(key)
        if signs is None:
            gen = torch.Generator().manual_seed(0)
            signs = (torch.randint(0, 2, (sample.numel(),), generator=gen) * 2 - 1).float()
            signs = self._signs[key] = signs.to(sample.device)
        return torch.stack([sample.abs().sum(), (sample * signs).sum()]).double()
