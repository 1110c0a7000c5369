"""A plain ``loss.backward()`` beside DeepSpeed's ``engine.backward`` (pure Python, no torch):
LOSS_SCALE.

DeepSpeed divides the loss it is given by ``gradient_accumulation_steps`` (K) in
``engine.backward``; a backward the script runs itself (``(coef * penalty).backward()`` to free
a small graph early) adds its gradient to the same accumulation undivided. When every
micro-step of every window runs one such backward of a penalty on the parameters (the
``penalty`` records of :mod:`._losses_terms`) with nothing dividing it by K, while the
engine's backwards are the window's K micro-steps, the penalty weighs K x its coefficient
per optimizer step, where the large batch's loss (loss + coef * penalty) adds it once.

Not judged: a penalty whose constants may hold a 1/K, a window without exactly K engine
backwards and K such penalty backwards, a run whose K is not DeepSpeed's own.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, StepWindow, _mk, _n
from accumguard.observe._term_reads import _k_divisions, _may_hold_k
from accumguard.observe._weight_rules import _short

__all__ = ["plain_penalty_findings"]


def _coef(divs: list[list[Any]]) -> float:
    out = 1.0
    for op, c in divs:
        out = out * float(c) if str(op) == "*" else out / float(c)
    return out


def plain_penalty_findings(rank: int | None, windows: list[StepWindow],
                           ds_ga: int | None) -> list[Finding]:
    """LOSS_SCALE for a penalty backpropagated beside ``engine.backward`` (module doc)."""
    if not isinstance(ds_ga, int) or ds_ga < 2:
        return []
    k = ds_ga
    found: list[tuple[StepWindow, list[Any]]] = []
    for w in windows:
        if w.engine != "deepspeed":
            continue
        if w.terms is None and not w.losses:
            continue  # a window the loss record did not sample: not read
        engine_bw = [i for i, b in enumerate(w.ds_boundaries or []) if b is not None]
        pens = [r for r in (w.terms or []) if r and r[0] == "penalty"]
        if len(engine_bw) != k or len(pens) != k:
            return []
        if any(int(r[1]) in engine_bw or _k_divisions(r[2], k) or _may_hold_k(r[2], k)
               for r in pens):
            return []
        found.append((w, pens[0]))
    if not found:
        return []
    w, pen = found[0]
    coef = _coef(pen[2])
    return [_mk("LOSS_SCALE", "error", rank, w.step, None,
                f"{_short(str(pen[3]))}: in each of the {k} micro-steps of {len(found)} "
                f"window(s) (optimizer step {_n(w.step)} first) a penalty on the parameters "
                f"alone (times {coef:.4g}) was backpropagated with a plain .backward() beside "
                f"engine.backward(loss); DeepSpeed divides only the loss it is given by "
                f"gradient_accumulation_steps = {k}, and nothing divided the penalty by {k}: "
                f"the window's gradient holds {k} copies of its gradient, {k} x {coef:.4g} = "
                f"{k * coef:.4g} per optimizer step, where the large batch's loss adds it "
                f"once ({coef:.4g})",
                title_=f"a penalty backpropagated outside engine.backward weighs {k}x its "
                       "coefficient",
                fix="Add the penalty to the loss handed to DeepSpeed (engine.backward(loss + "
                    "coef * penalty)), which divides the whole loss by "
                    "gradient_accumulation_steps; or divide it by "
                    "engine.gradient_accumulation_steps() before its own backward.")]
