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
``Σ r·g`` must scale by the same ``c`` (to ``1e-4`` of ``Σ|g|``), else the gradient was
changed by something that is not one scale (a hand-written all-reduce, weight decay added
to the gradient) and nothing is claimed (None). At most ``_SAMPLE`` strided elements are
read: a few reductions per checked backward, no copy of the gradient.
"""

from __future__ import annotations

import torch

from accumguard.observe._introspect import local

__all__ = ["BoundaryScale"]

_SAMPLE = 1 << 16
_UNIFORM_TOL = 1e-4


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

    def after_backward(self) -> None:
        self._end = self._measure()
        self._at = None

    def before_clip(self) -> None:
        if self._end is not None and self._at is None:
            self._at = self._measure()

    def scale(self) -> float | None:
        """``c`` with received = c × accumulated (on the sampled parameter), or None: no
        checked backward in this window, no gradient, or not one scale."""
        if self._end is None:
            return None
        at = self._at if self._at is not None else self._measure()
        if at is None:
            return None
        (a0, p0), (a1, p1) = self._end.tolist(), at.tolist()
        if a0 <= 0.0 or a1 <= 0.0:
            return None
        c = a1 / a0
        if abs(p1 - c * p0) > _UNIFORM_TOL * a1:
            return None
        return c

    @torch.no_grad()
    def _measure(self) -> torch.Tensor | None:
        g = self.param.grad
        if g is None:
            return None
        flat = local(g).detach().reshape(-1)
        n = flat.numel()
        if n == 0:
            return None
        sample = flat[:: max(1, n // _SAMPLE)].float()
        key = (sample.numel(), sample.device)
        signs = self._signs.get(key)
        if signs is None:
            gen = torch.Generator().manual_seed(0)
            signs = (torch.randint(0, 2, (sample.numel(),), generator=gen) * 2 - 1).float()
            signs = self._signs[key] = signs.to(sample.device)
        return torch.stack([sample.abs().sum(), (sample * signs).sum()]).double()
