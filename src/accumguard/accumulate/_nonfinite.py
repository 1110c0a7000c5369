"""The non-finite policy at a boundary: whether to skip the window, and what to say.

The fast path costs one host sync per window (:func:`decide_nonfinite`); the slow path
(:func:`report_nonfinite`, a window was skipped) gathers which rank's loss went bad where.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING

import torch

from accumguard.core.errors import AccumguardWarning, NonFiniteError
from accumguard.engines import Engine

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from accumguard.accumulate._config import NonFinitePolicy
    from accumguard.accumulate._window import Window

log = logging.getLogger("accumguard")


def decide_nonfinite(engine: Engine, w: Window, bad: torch.Tensor, *, prefix: str) -> bool:
    """Whether to skip the window, from the engine's global gradient flag and this rank's
    loss flag, read in one host sync. A non-finite loss poisons the gradients it reaches,
    so the gradient flag covers it on every rank; only a loss with no gradient path to
    any parameter (e.g. the NaN mean of an empty micro-batch) leaves them finite. On one
    process that window is skipped too; across ranks the flags could differ, so the
    rank only warns (a skip decided alone would desynchronise the ranks)."""
    local = (torch.full((), -1, dtype=torch.int64, device=bad.device)
             if w._bad_micro is None else w._bad_micro.to(bad.device))
    grad_bad, loss_micro = (int(x) for x in
                            torch.stack([bad.to(torch.int64).reshape(()), local]).tolist())
    if engine.world_size == 1:
        return bool(grad_bad) or loss_micro >= 0
    if loss_micro >= 0 and not grad_bad:
        warnings.warn(
            f"{prefix}accumguard: window {w.index}: the loss was NaN/Inf at "
            f"micro-step {loss_micro} on this rank but no gradient was (the loss has no "
            "gradient path to any parameter, e.g. the mean of an empty micro-batch); the "
            "window was stepped on every rank. Use a summed loss (0 for an empty batch)",
            AccumguardWarning, stacklevel=4)
    return bool(grad_bad)


def report_nonfinite(engine: Engine, w: Window, cause: str, expected_overflow: bool, *,
           policy: NonFinitePolicy, prefix: str) -> tuple[str, NonFiniteError | None]:
    """The slow path (a window was skipped): say which rank's loss went bad at which
    micro-step, and warn, or return the NonFiniteError to raise for nonfinite="raise".
    The extra all-gather runs only here, and every rank gets here together (the decision
    was global). Returns the skip reason and the error to raise, if any."""
    bad_micro = w._bad_micro
    local = (torch.full((1,), -1, dtype=torch.int64) if bad_micro is None
             else bad_micro.reshape(1).to(torch.int64))
    if engine.world_size > 1:
        import torch.distributed as dist

        local = local.to(engine.device)
        gathered = [torch.empty_like(local) for _ in range(engine.world_size)]
        dist.all_gather(gathered, local, group=engine.process_group)
        per_rank = [int(x) for x in torch.cat(gathered).tolist()]
    else:
        per_rank = [int(local.item())]
    losses = {r: m for r, m in enumerate(per_rank) if m >= 0}
    multi = engine.world_size > 1
    if losses:
        where = "; ".join((f"rank {r} " if multi else "") + f"micro-step {m}"
                          for r, m in sorted(losses.items()))
        what = f"non-finite loss (NaN/Inf) at {where}"
    else:
        what = f"{cause} although every loss of the window was finite"
        if expected_overflow:
            what = cause
    text = (f"window {w.index} skipped on every rank (no optimizer step, scheduler held, "
            f"gradients discarded): {what}")
    raising = policy == "raise" and (bool(losses) or not expected_overflow)
    if raising:
        return what, NonFiniteError(
            f"{prefix}accumguard: {text}. Find the batch or operation that "
            "produces it (torch.autograd.set_detect_anomaly(True) names the op), or build "
            "the Accumulator with nonfinite='skip' to skip such windows and go on",
            window=w.index, ranks=losses)
    hint = ("normal while an fp16 loss scale adapts" if expected_overflow and not losses
            else "nonfinite='raise' stops training instead")
    warnings.warn(f"{prefix}accumguard: {text} ({hint})", AccumguardWarning,
                  stacklevel=2)
    log.warning("accumguard: %s", text)
    return what, None
