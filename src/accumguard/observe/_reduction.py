"""What the engine does to the gradients of the ranks when it reduces them: the factor by
which it multiplies their sum (``1/W`` for DDP's, FSDP2's and DeepSpeed's average), read
from the engine objects at an optimizer step. The loss-weight ledger
(:mod:`accumguard.observe._ledger`) composes it with the loss weights the ranks' backwards
gave their tokens: a window normalised to the global token count and then averaged again
weighs its tokens 1/W in total.

Only what the engine's own state says is returned; anything it cannot read for certain (a
DDP communication hook, FSDP2 parameter groups that disagree, an unknown engine) is None,
and the ledger then judges nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["fsdp2_mesh", "rank_factor", "unit_factors"]


def rank_factor(engine: str, roots: Sequence[object],
                fsdp_groups: Mapping[int, Sequence[object]], ds_engine: object) -> float | None:
    """The factor the engine applies to the sum over ranks of the ranks' gradients, or
    None when it is unknown (or the run has no engine reduction: data parallelism by hand
    is judged from the gradient checksums instead). ``roots``: the DDP/FSDP2 modules seen;
    ``fsdp_groups``: FSDP2's parameter groups per root (as the observer keeps them)."""
    try:
        if engine == "ddp":
            return _ddp(roots)
        if engine == "fsdp2":
            return _fsdp2([g for gs in fsdp_groups.values() for g in gs])
        if engine == "deepspeed" and ds_engine is not None:
            fp16 = getattr(ds_engine, "fp16_enabled", None)
            if callable(fp16) and fp16():
                return None  # its dynamic loss scale multiplies the recorded loss weights
            size = int(getattr(ds_engine, "dp_world_size", 0) or 0)
            return 1.0 / size if size > 0 else None
    except (AttributeError, RuntimeError, TypeError, ValueError, ZeroDivisionError):
        return None
    return None


def _ddp(roots: Sequence[object]) -> float | None:
    from torch.nn.parallel import DistributedDataParallel

    factors = set()
    for m in roots:
        if not isinstance(m, DistributedDataParallel):
            continue
        if getattr(m, "_comm_hooks", None):
            return None  # a communication hook decides the reduction: unknown
        factors.add(1.0 / m.process_group.size())
    return factors.pop() if len(factors) == 1 else None


def _fsdp2(groups: Sequence[object]) -> float | None:
    """``groups``: FSDP2's ``FSDPParamGroup`` objects, whose attributes read here torch does
    not declare (a missing one raises AttributeError: the factor is then unknown)."""
    factors = set()
    for group in groups:
        factor = getattr(group, "gradient_divide_factor")  # noqa: B009
        if factor is None:  # FSDP2's default: the average over its data-parallel ranks
            factor = getattr(group, "mesh_info").mesh.size()  # noqa: B009
        factors.add(1.0 / float(factor))
    return factors.pop() if len(factors) == 1 else None


def fsdp2_mesh(engine: str, fsdp_groups: Mapping[int, Sequence[object]]) -> int | None:
    """The largest number of ranks an FSDP2 unit's mesh spans (its device mesh, the
    replicate dimension of HSDP included); None when not FSDP2 or it cannot be read."""
    if engine != "fsdp2":
        return None
    try:
        sizes = [int(getattr(group, "mesh_info").mesh.size())  # noqa: B009
                 for gs in fsdp_groups.values() for group in gs]
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
    return max(sizes) if sizes else None


def unit_factors(engine: str, fsdp_groups: Mapping[int, Sequence[object]]) -> list[list[Any]] | None:
    """FSDP2 units that reduce with different factors (``set_gradient_divide_factor`` is set
    per unit, on the module it is called on, not its children): per distinct factor,
    [factor, up to three module names, number of units]; None when they agree or cannot be
    read."""
    if engine != "fsdp2":
        return None
    by: dict[float, list[str]] = {}
    try:
        for group in (g for gs in fsdp_groups.values() for g in gs):
            factor = getattr(group, "gradient_divide_factor")  # noqa: B009
            if factor is None:
                factor = getattr(group, "mesh_info").mesh.size()  # noqa: B009
            name = getattr(group, "_module_fqn", None)
            by.setdefault(1.0 / float(factor), []).append(str(name) if name else "(root)")
    except (AttributeError, RuntimeError, TypeError, ValueError, ZeroDivisionError):
        return None
    if len(by) < 2:
        return None
    return [[f, names[:3], len(names)] for f, names in sorted(by.items())]
