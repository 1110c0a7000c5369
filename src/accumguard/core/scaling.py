"""The one place where normalisation factors meet.

Every engine does something to gradients on its own: DDP and FSDP2 average
over the data-parallel ranks, DeepSpeed's ``backward`` divides by its own
gradient-accumulation steps, a plain process does nothing. The Accumulator
wants the optimizer to receive exactly ``G = Σ g_i / N`` (sum of per-sample
losses over every micro-step and rank of the window, over the window's count
N). :func:`loss_scale` derives the factor each micro-step's summed loss must be
multiplied by so that, *after* the engine's own operations, G is what arrives.
Nothing else in accumguard divides by K, N or W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accumguard.core.errors import ConfigError, UsageError

__all__ = ["GradReduction", "loss_scale"]


@dataclass(frozen=True, kw_only=True)
class GradReduction:
    """What an engine does to gradients between ``backward`` and the optimizer.

    ``averages_over_ranks``: the reduction divides the rank sum by ``world_size``
    (DDP, FSDP2 by default, DeepSpeed). ``divides_by``: an extra divisor the
    engine applies on its own (DeepSpeed ``backward(scale_wrt_gas=True)``
    divides by its configured GA). ``world_size``: ranks in the reduction.
    """

    world_size: int = 1
    averages_over_ranks: bool = False
    divides_by: float = 1.0


def loss_scale(
    *,
    mode: str,
    reduction: GradReduction,
    global_count: float,
    window_micro_steps: int,
) -> float:
    """Factor to multiply a micro-step's loss by so the optimizer receives the exact mean.

    ``mode="sum"``: the loss is a *sum* over ``local_count`` samples/tokens; the
    target is the sum over all micro-steps and ranks divided by ``global_count``.
    ``mode="mean"``: the loss is already a mean over equal-sized micro-batches;
    the target is the mean of the ``window_micro_steps × world_size`` means
    (exact only when every micro-batch has the same size, which the
    Accumulator checks before calling this).
    """
    engine = reduction.divides_by * (reduction.world_size if reduction.averages_over_ranks else 1)
    # Explicit checks, not asserts: they must hold under `python -O` too, where a negative or
    # NaN count would otherwise step the wrong way or poison every parameter silently.
    if not (math.isfinite(engine) and engine > 0):
        raise ConfigError(
            f"the engine's gradient reduction factor is {engine!r} (world_size="
            f"{reduction.world_size}, divides_by={reduction.divides_by}); expected a positive "
            "finite number. Fix the engine adapter's reduction()")
    if mode == "sum":
        if isinstance(global_count, bool) or not isinstance(global_count, (int, float)) or \
                not math.isfinite(global_count) or global_count <= 0:
            raise UsageError(
                f"loss_scale(mode='sum') got global_count={global_count!r}; expected a positive "
                "finite number of samples/tokens in the window. The Accumulator skips empty "
                "windows before scaling; check count_fn returns counts >= 0")
        return engine / global_count
    if mode == "mean":
        if isinstance(window_micro_steps, bool) or not isinstance(window_micro_steps, int) or \
                window_micro_steps <= 0:
            raise UsageError(
                f"loss_scale(mode='mean') got window_micro_steps={window_micro_steps!r}; "
                "expected a positive int (the micro-steps of the window)")
        return engine / (window_micro_steps * reduction.world_size)
    raise ConfigError(f"unknown normalisation mode {mode!r}; expected 'sum' or 'mean'")
