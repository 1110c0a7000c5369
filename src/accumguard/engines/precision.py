"""fp32 gradient accumulation for low-precision (bf16/fp16) parameters.

Why: a bf16 gradient has 8 significant bits. Summing K micro-step gradients in
``p.grad`` (what autograd does) rounds the running sum to 8 bits after every
add, and the error grows with K (failure class F12; about 1e-2 to 7e-2 of the
update at K = 512 on small models). :class:`MainGrads` moves each micro-step's
gradient, as soon as autograd has finished it, into an fp32 buffer and clears
``p.grad``; the window's sum lives in fp32. At the boundary the buffer is
reduced once in fp32 (one all-reduce of one flat buffer on DDP) and written
back to ``p.grad`` in the parameter's dtype, which is one rounding whatever K
(the optimizer of a bf16 parameter can only take a bf16 gradient).

Cost: 4 bytes per low-precision parameter element (the buffer lives for the
whole run, allocated once) and one fp32 add per element per micro-step.

The *mode* (:data:`AccumulationDtype`) is chosen on the Accumulator:
``"auto"`` (fp32 accumulation when a trainable parameter is bf16/fp16, else
nothing to do), ``"float32"`` (required: engines that cannot provide it raise
ConfigError with the fix) and ``"native"`` (accumulate in the parameter's dtype,
as the engine does by itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

__all__ = ["LOW_PRECISION", "AccumulationDtype", "MainGrads", "low_precision_params"]

#: How gradients of a window are summed; see the module docstring.
AccumulationDtype = Literal["auto", "float32", "native"]

LOW_PRECISION = (torch.bfloat16, torch.float16)


def low_precision_params(params: Any) -> list[torch.nn.Parameter]:
    """Trainable parameters stored in bf16/fp16 (whose gradients autograd keeps in bf16/fp16)."""
    return [p for p in params if p.requires_grad and p.dtype in LOW_PRECISION]


class MainGrads:
    """One flat fp32 buffer holding the window's gradient sum of the low-precision parameters.

    It covers every trainable parameter handed to it (an fp32 parameter's sum in the buffer
    is the same sum autograd would form, bit for bit), so that DDP can leave every
    micro-step under ``no_sync`` and reduce the one buffer at the boundary.

    A post-accumulate-grad hook on each parameter adds the finished micro-step gradient into
    the parameter's view of the buffer (in fp32) and sets ``p.grad`` to ``None``, so autograd
    never sums micro-gradients in bf16. :meth:`flush` (at the boundary) optionally reduces the
    buffer across ranks and writes it back to ``p.grad``.
    """

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        numel = sum(p.numel() for p in params)
        device = params[0].device if params else torch.device("cpu")
        self.flat = torch.zeros(numel, dtype=torch.float32, device=device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(v))  # type: ignore[no-untyped-call]
                         for p, v in zip(params, self.views, strict=True)]
        self.pending = False  # the buffer holds gradients not yet written back
        #: Set to True to keep a copy of each window's reduced fp32 sum in ``last_sum``
        #: (benchmarks and tests measure the accumulation error before the final cast).
        self.keep_last = False
        self.last_sum: torch.Tensor | None = None

    def _hook(self, view: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def take(p: torch.Tensor) -> None:
            if p.grad is not None:
                view.add_(p.grad)  # fp32 += bf16, computed in fp32
                p.grad = None
                self.pending = True
        return take

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def flush(self, reduce: Callable[[torch.Tensor], None] | None = None) -> bool:
        """Reduce the buffer (``reduce(flat)`` in place, e.g. an all-reduce) and hand it to
        ``p.grad`` in the parameter's dtype; the buffer is zeroed for the next window.
        Returns whether ``reduce`` ran (False when no gradient arrived in this window)."""
        if not self.pending and reduce is None:
            return False
        if reduce is not None:
            reduce(self.flat)
        if self.keep_last:
            self.last_sum = self.flat.clone()
        for p, view in zip(self.params, self.views, strict=True):
            p.grad = view.to(p.dtype, copy=True)
        self.flat.zero_()
        self.pending = False
        return reduce is not None

    def discard(self) -> None:
        """Drop the window's partial sum (an aborted window)."""
        self.flat.zero_()
        self.pending = False
        for p in self.params:
            p.grad = None

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
