"""Input checks of the Accumulator: counts, the objects it is given, the gathered counts.

Each check raises at construction or before the first backward of a window, with what
was seen, what was expected and the fix, instead of a silent wrong step later.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from accumguard.core.errors import ConfigError, UsageError


def batch_size(batch: object) -> int:
    """Samples in a micro-batch: the leading dimension of its first tensor.

    The default ``count_fn``. For token-level losses pass your own, e.g.
    ``count_fn=lambda b: (b["labels"] != -100).sum()``.
    """
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise ConfigError("a 0-d tensor micro-batch has no sample dimension; pass count_fn")
        return batch.shape[0]
    values: Iterable[object]
    if isinstance(batch, dict):
        values = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        values = ()
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return v.shape[0]
    raise ConfigError(
        f"cannot tell how many samples a {type(batch).__name__} micro-batch holds; pass "
        "count_fn=... returning the number of samples (or valid tokens) of a micro-batch"
    )


def check_count(index: int, seen: float, expected: float) -> None:
    if seen != expected:
        raise UsageError(
            f"backward() got count={seen:g} but count_fn reported {expected:g} for this "
            f"micro-batch (micro-step {index}). The window's N is fixed before the first "
            "backward, so pass a count_fn that returns the same count (e.g. valid tokens) to "
            "the Accumulator")


@dataclass(frozen=True)
class BadCount:
    """A count_fn result that is not a number: carried to the all-gather, raised there."""

    seen: str


def as_count(x: Any) -> Any:
    """``x`` if it is a usable count (a real number or a 1-element real tensor), else a
    :class:`BadCount` describing it. Values (negative, NaN) are checked after the gather."""
    if isinstance(x, torch.Tensor):
        if x.numel() == 1 and not (x.is_complex() or x.dtype == torch.bool):
            return x
        return BadCount(f"a {x.dtype} tensor of shape {tuple(x.shape)}")
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return x
    return BadCount(f"{x!r:.40} (a {type(x).__name__})")


def check_callables(**objs: object) -> None:
    """Catch the common mix-ups (a list of optimizers, a scheduler class, a count that is
    not a function) at construction, instead of as an AttributeError mid-training."""
    needs = {"optimizer": ("step", "zero_grad", "param_groups"), "scheduler": ("step",),
             "scaler": ("scale", "unscale_", "step", "update", "get_scale")}
    for name, obj in objs.items():
        if obj is None:
            continue
        if name == "count_fn":
            if not callable(obj):
                raise ConfigError(f"`count_fn` ({obj!r:.60}) must be a function of a micro-batch "
                                  "returning its number of samples/tokens")
            continue
        missing = [a for a in needs[name] if not hasattr(obj, a)]
        if missing or isinstance(obj, type):
            fix = {"optimizer": "a torch.optim.Optimizer instance (one optimizer; build one "
                                "over all parameters, or param groups)",
                   "scheduler": "an LR scheduler instance, e.g. "
                                "torch.optim.lr_scheduler.LambdaLR(optimizer, ...)",
                   "scaler": "a torch.amp.GradScaler instance"}[name]
            raise ConfigError(f"`{name}` is {obj!r:.60} (a {type(obj).__name__}, missing "
                              f"{missing or ['an instance']}); expected {fix}")


def check_optimizer_params(model: object, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer must hold parameters, and some of them must be the model's: otherwise
    every step is a silent no-op on the model being trained."""
    params = [p for g in optimizer.param_groups for p in g.get("params", [])]
    if not params:
        raise ConfigError(
            f"the {type(optimizer).__name__} holds no parameters (empty param_groups); "
            "expected the model's parameters. Build it as Optimizer(model.parameters(), ...)")
    if not isinstance(model, torch.nn.Module):
        return
    mine = {id(p) for p in model.parameters()}
    if mine and not any(id(p) in mine for p in params):
        raise ConfigError(
            f"the {type(optimizer).__name__} holds {len(params)} parameters but none of them "
            "belongs to the model given to the Accumulator, so no step would change it; "
            "expected this model's parameters. Build the optimizer from them (after wrapping it: for FSDP2, after "
            "fully_shard)")



def check_gathered_counts(rows: list[list[float]], bad: BadCount | None, counts: list[Any], *,
                          prefix: str, rank: int, window: int) -> None:
    """Counts must be finite numbers >= 0 on every rank (decided from the gathered rows,
    which are the same on every rank, so all ranks raise together)."""
    multi = len(rows) > 1

    def where(r: int) -> str:
        return f" on rank {r}" if multi else ""

    typed = [r for r, row in enumerate(rows) if row[4] > 0]
    if typed:
        seen = (f"{bad.seen}" if bad is not None else
                "a value that is not a number")
        raise ConfigError(
            f"{prefix}count_fn returned {seen}{where(typed[0])} in window "
            f"{window}; expected a real number >= 0 (samples or valid tokens "
            "of the micro-batch) or a 1-element tensor. Fix count_fn, e.g. "
            "count_fn=lambda b: (b['labels'] != -100).sum()")
    for r, row in enumerate(rows):
        if row[0] > 0 and (not math.isfinite(row[1]) or row[2] < 0):
            mine = [x for x in counts if not isinstance(x, BadCount)]
            vals = (f" (this rank's counts: {[float(torch.as_tensor(x)) for x in mine]})"
                    if r == rank or not multi else "")
            raise ConfigError(
                f"{prefix}count_fn returned a negative, NaN or infinite count"
                f"{where(r)} in window {window}: sum {row[1]:g}, min "
                f"{row[2]:g}{vals}; expected finite counts >= 0 (N divides the loss: a "
                "NaN/inf N freezes training, a negative one steps uphill). Fix count_fn")
