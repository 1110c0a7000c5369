"""The two moments :mod:`._grad_hooks` reads around the script's post-accumulate-grad hooks,
and what they say at the step (pure arithmetic: no observer, so the window's tally reads it).

``||g||_2`` and ``||g||_4`` of a gradient, in float64 on its device; a hook that multiplied
``.grad`` by a scalar ``c`` moves both by exactly ``|c|``, one that did anything else (an
all-reduce, a clamp) moves them apart.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SCALAR_TOL", "moments", "rescaled"]

#: Relative agreement of the two moments' ratios under which the change was one scalar (a
#: float32 product re-rounded: ~1e-7), and the distance from 1 that is a rescale.
SCALAR_TOL = 1e-5


def moments(g: object) -> torch.Tensor | None:
    if not isinstance(g, torch.Tensor):
        return None
    to_local = getattr(g, "to_local", None)  # an FSDP2 DTensor: this rank's shard
    f = to_local() if callable(to_local) and type(g) is not torch.Tensor else g
    if f.layout != torch.strided or f.numel() == 0 or not f.is_floating_point():
        return None  # (a sparse, empty, complex or integer gradient: not read)
    with torch.no_grad():
        return torch.stack([torch.linalg.vector_norm(f, 2, dtype=torch.float64),
                            torch.linalg.vector_norm(f, 4, dtype=torch.float64)])


def rescaled(moments: list[tuple[int, torch.Tensor]]) -> list[list[float]] | None:
    """Per backward pass in which a hook rescaled some parameter's ``.grad``: [the pass
    (0-based), parameters rescaled, parameters measured in it, smallest factor, largest];
    None when no hook rescaled any. One host read for the window."""
    if not moments:
        return None
    try:
        rows = torch.stack([t for _, t in moments]).tolist()
    except RuntimeError:  # gradients on several devices: one read each
        rows = [t.tolist() for _, t in moments]
    per: dict[int, list[Any]] = {}
    for (b, _), (n2, n4, a2, a4) in zip(moments, rows, strict=True):
        row = per.setdefault(b, [b, 0, 0, None, None])
        row[2] += 1
        if not (n2 > 0 and n4 > 0):
            continue
        c2, c4 = a2 / n2, a4 / n4
        if c2 <= SCALAR_TOL or abs(c2 - c4) > SCALAR_TOL * max(c2, c4) \
                or abs(c2 - 1.0) <= SCALAR_TOL:
            continue  # cleared (an optimizer stepped in the hook), not one scalar, or none
        row[1] += 1
        row[3] = c2 if row[3] is None else min(row[3], c2)
        row[4] = c2 if row[4] is None else max(row[4], c2)
    out = [[float(x) for x in r] for r in per.values() if r[1]]
    return out or None
