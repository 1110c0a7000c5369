"""FSDP2 units that reduce the ranks' gradients with different factors (F10).

``FSDPModule.set_gradient_divide_factor`` (and ``set_force_sum_reduction_for_comms``) set
the reduction of the unit they are called on, not of its children: called on the root of
a model whose blocks are units of their own, the root's parameters are summed over the
ranks while the blocks' are still averaged. One loss backwarded through all of them gives
every parameter the same per-token weights, so units multiplied by different factors
cannot all receive the large batch's gradient. The loss-weight ledger (:mod:`._ledger`)
gives each step's total weight before the engine's reduction; each unit factor ``f``
makes it ``total·f`` (steps where the loop rescaled the reduced gradient are left out). The units whose factor makes it 1 are right and the others are
off by the ratio of the factors: an error naming both. When no factor makes it 1 the
disagreement is still reported, as a warning (at most one kind of unit can be right).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from accumguard.observe._records import Finding, _mk
from accumguard.observe._weight_rules import _short

__all__ = ["UnitStep", "unit_findings"]


class UnitStep(NamedTuple):
    """One ledger step as this rule reads it."""

    step: int
    site: str
    total: float  # the tokens' summed weight over the ranks before the engine's reduction
    scale: float | None  # what the loop did to the reduced gradient (1: nothing)
    units: list[list[Any]] | None  # [factor, names, count] per distinct unit factor
    tol: float
    sole: bool  # each backward was the loss call times constants
    unit: str  # what the counts count


def _names(entry: list[Any]) -> str:
    names, count = list(entry[1]), int(entry[2])
    shown = ", ".join(f"`{n}`" for n in names)
    more = f" and {count - len(names)} more" if count > len(names) else ""
    return f"{count} unit{'s' if count != 1 else ''} ({shown}{more})"


def _verb(entry: list[Any], plural: str, single: str) -> str:
    return single if int(entry[2]) == 1 else plural


def _factor(f: float) -> str:
    return f"1/{round(1 / f):d}" if f < 1 and abs(1 / f - round(1 / f)) < 1e-9 else f"{f:g}"


def unit_findings(steps: Sequence[UnitStep]) -> list[Finding]:
    """One finding for a run whose judged steps all show FSDP2 units disagreeing."""
    # (a step whose conservation scale is not 1 is left out: with units reduced alike the
    # scale is the loop's own, with units that disagree it is a fit across them)
    judged = [s for s in steps if s.units and s.sole and s.scale is not None
              and abs(s.scale - 1.0) <= s.tol]
    if not judged:
        return []
    s = judged[0]
    if any(x.units != s.units for x in judged):
        return []
    assert s.units is not None
    factors = [float(e[0]) for e in s.units]
    right = [e for e in s.units if all(abs(x.total * float(e[0]) - 1.0) <= x.tol for x in judged)]
    listing = "; ".join(f"{_names(e)} {_verb(e, 'multiply', 'multiplies')} it by "
                        f"{_factor(float(e[0]))}" for e in s.units)
    fix = ("Set the reduction on every FSDP2 unit, not only the root: `for m in model.modules(): "
           "if isinstance(m, FSDPModule): m.set_gradient_divide_factor(...)` (and "
           "`set_force_sum_reduction_for_comms`); or keep FSDP2's average everywhere and "
           "normalise the loss by the window's count times the world size.")
    if len(right) == 1:
        good = right[0]
        wrong = [e for e in s.units if e is not good]
        ratios = ", ".join(f"{_factor(float(e[0]) / float(good[0]))}x" for e in wrong)
        return [_mk(
            "F10", "error", None, s.step, None,
            f"{_short(s.site)}: FSDP2 reduces the ranks' gradients with different factors in "
            f"different units: {listing}. With the loss weighted as recorded (its {s.unit} "
            f"total {s.total:.4g} over the ranks before the reduction, {len(judged)} step(s)), "
            f"the {_names(good)} {_verb(good, 'receive', 'receives')} the large batch's "
            f"gradient and the others {ratios} of it",
            title_=f"FSDP2 units reduce with different factors ({', '.join(map(_factor, factors))}): "
                   f"part of the model gets {ratios} the large batch's gradient",
            fix=fix)]
    return [_mk(
        "F10", "warning", None, s.step, None,
        f"{_short(s.site)}: FSDP2 reduces the ranks' gradients with different factors in "
        f"different units: {listing}. One loss reaches them all with the same weights, so at "
        "most one kind of unit can receive the large batch's gradient; with the weights "
        "recorded none of the factors gives the large batch's total, so which one is "
        "meant is not known",
        title_="FSDP2 units reduce with different factors",
        fix=fix)]
