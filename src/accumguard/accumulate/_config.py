"""The Accumulator's settings as one frozen, keyword-only dataclass, validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from accumguard.core.boundary import check_accumulation_steps
from accumguard.core.errors import ConfigError
from accumguard.engines.precision import AccumulationDtype

#: What a window with a NaN/Inf loss or gradient does: ``"skip"`` it on every rank (no
#: optimizer step, scheduler held, gradients discarded, a warning) or ``"raise"``
#: :class:`~accumguard.core.errors.NonFiniteError` (after discarding it the same way).
NonFinitePolicy = Literal["skip", "raise"]

@dataclass(frozen=True, kw_only=True)
class AccumulationConfig:
    """What the Accumulator does, validated once at construction.

    ``normalization="sum"``: the loss you pass to ``backward`` is the **sum**
    over samples/tokens, and the optimizer receives that sum over the whole
    window and all ranks divided by its count N (exact for any mix of sizes).
    ``"mean"``: the loss is already a per-micro-batch mean; valid only when
    every micro-batch of a window has the same size (checked, across ranks).
    """

    accumulation_steps: int
    normalization: str = "sum"
    max_grad_norm: float | None = None
    drop_last_window: bool = False
    nonfinite: NonFinitePolicy = "skip"
    accumulation_dtype: AccumulationDtype = "auto"
    master_weights: bool = False

    def __post_init__(self) -> None:
        check_accumulation_steps(self.accumulation_steps)
        if not isinstance(self.normalization, str) or self.normalization not in ("sum", "mean"):
            raise ConfigError(
                f"`normalization` ({self.normalization!r}) must be 'sum' (loss_fn returns the "
                "sum over samples/tokens; exact for uneven sizes) or 'mean' (equal-size "
                "micro-batches, loss already averaged)"
            )
        if self.max_grad_norm is not None and not (
            isinstance(self.max_grad_norm, (int, float))
            and not isinstance(self.max_grad_norm, bool) and self.max_grad_norm > 0
            and math.isfinite(self.max_grad_norm)
        ):
            raise ConfigError(
                f"`max_grad_norm` ({self.max_grad_norm!r}) must be a positive finite number, "
                "or None to disable clipping"
            )
        if not isinstance(self.drop_last_window, bool):
            raise ConfigError(f"`drop_last_window` ({self.drop_last_window!r}) must be True or "
                              "False")
        if not isinstance(self.nonfinite, str) or self.nonfinite not in get_args(NonFinitePolicy):
            raise ConfigError(
                f"`nonfinite` ({self.nonfinite!r}) must be 'skip' (a window with a NaN/Inf "
                "loss or gradient is skipped on every rank, with a warning) or 'raise' "
                "(NonFiniteError after discarding it)")
        if not isinstance(self.accumulation_dtype, str) or (
                self.accumulation_dtype not in get_args(AccumulationDtype)):
            raise ConfigError(
                f"`accumulation_dtype` ({self.accumulation_dtype!r}) must be 'auto' (sum the "
                "window's gradients in fp32 when parameters are bf16/fp16), 'float32' (the "
                "same, and refuse an engine setup that cannot) or 'native' (sum in the "
                "parameters' dtype, as the engine does by itself)")
        if not isinstance(self.master_weights, bool):
            raise ConfigError(f"`master_weights` ({self.master_weights!r}) must be True or False")
        if self.master_weights and self.accumulation_dtype == "native":
            raise ConfigError(
                "master_weights=True with accumulation_dtype='native': fp32 master weights "
                "step on the window's fp32 gradient sum, which 'native' does not form; use "
                "accumulation_dtype='auto' (default) or 'float32'")
