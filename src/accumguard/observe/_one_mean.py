"""Whether a loss that is a sum of terms is, as a whole, one loss call's normalisation: every
other term sits under the call's constants and mean (pure Python, on the per-term records of
:mod:`._losses_terms`). The scale rules then read the call's weight as the whole loss's."""

from __future__ import annotations

from typing import Any

from accumguard.core.window import StepRecord

__all__ = ["inside_one_normalisation"]


def inside_one_normalisation(w: StepRecord, site: str, k: int) -> list[str] | None:
    """The graph nodes of the other terms of every micro-step's loss when each is under the
    same constants and the same mean as the loss call at ``site`` (that call's whole chain,
    then only a coefficient of its own): ``(ce + c * z).mean()`` per token, or a mean loss
    call plus ``c * z.mean()`` over its rows. The call's weight is then the whole loss's:
    not divided by K, no term of it is. None otherwise (a term with a divisor of its own,
    another loss call, a mean over other rows, a micro-step without the call)."""
    terms, losses = w.terms, w.losses
    if not terms or not losses or any(str(r[0]) != site for r in losses):
        return None
    by_micro: dict[int, list[list[Any]]] = {}
    for r in terms:
        if r and r[0] == "term":
            by_micro.setdefault(int(r[1]), []).append(r)
    if sorted(by_micro) != list(range(k)):
        return None
    names: set[str] = set()
    for rs in by_micro.values():
        mains = [r for r in rs if r[7] is not None and str(r[7]) == site]
        if len(mains) != 1 or len(rs) < 2:
            return None
        main = mains[0]
        head = [(str(op), float(c)) for op, c in main[4]]
        spans = [int(c) for c in main[5]]
        for r in rs:
            if r is main:
                continue
            chain = [(str(op), float(c)) for op, c in r[4]]
            over = [int(c) for c in r[5]]
            same_mean = (over == spans and bool(spans)) or (
                not spans and bool(main[10]) and over == [int(main[9])])
            if r[7] is not None or r[6] or not same_mean or chain[:len(head)] != head \
                    or any(op != "*" for op, _ in chain[len(head):]):
                return None
            names.add(str(r[3]))
    return sorted(names)
