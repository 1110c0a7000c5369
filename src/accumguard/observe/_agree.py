"""Cross-rank checks that survive accumguard failing on one rank.

A check that gathers something from every rank is a collective: if accumguard failed on
one rank and that rank stopped joining, every other rank would wait in it for ever, and
the user's run would hang. :func:`gather_rows` is called by every rank at the same point
of the run whatever its own state: a rank whose part failed (or whose observation is
already off) still joins, with a marker, and then every rank gets ``None`` and drops the
check together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accumguard.observe._failsafe import Failsafe

__all__ = ["gather_rows"]


def gather_rows(failsafe: Failsafe, compute: Callable[[], torch.Tensor], *, world: int,
                group: Any = None, device: torch.device | None = None,
                where: str = "cross-rank check") -> list[torch.Tensor] | None:
    """Every rank's ``compute()`` (float64 rows ``[n, c]``, n may differ per rank), or None
    on every rank when it failed on any rank. Two small all-gathers (counts, then rows)."""
    import torch.distributed as dist

    rows: torch.Tensor | None = None
    if failsafe.ok:
        out = failsafe.guard(where, compute)
        rows = out if isinstance(out, torch.Tensor) and out.dim() == 2 else None
        if rows is None and failsafe.ok:
            failsafe.fail(where, TypeError(f"{where}: rows expected, got {type(out).__name__}"))
    dev = device if device is not None else torch.device("cpu")
    head = torch.tensor([0.0 if rows is None else float(len(rows)),
                         1.0 if rows is None else 0.0], dtype=torch.float64, device=dev)
    heads = [torch.zeros_like(head) for _ in range(world)]
    dist.all_gather(heads, head, group=group)
    if any(float(h[1]) > 0 for h in heads) or rows is None:
        return None
    top = int(max(float(h[0]) for h in heads))
    padded = torch.zeros(top, rows.shape[1], dtype=torch.float64, device=dev)
    padded[: len(rows)] = rows.to(device=dev, dtype=torch.float64)
    out_rows = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(out_rows, padded, group=group)
    return [o[: int(float(h[0]))].cpu() for o, h in zip(out_rows, heads, strict=True)]
