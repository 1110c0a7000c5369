"""A term of the loss multiplied by the world size while the loss call beside it is not
(pure Python, no torch; the source read with :mod:`ast` in the parent process).

Under an engine that averages the ranks' gradients (DDP, FSDP2, DeepSpeed: the step's
``rank_factor`` is 1/W), a term that is a mean (or a statistic) of its own micro-batch's
rows already gets the large batch's weight from that average: the large batch's term is
the mean over all ranks' rows. Multiplying it by W on top (``loss = ce + coef * aux *
world_size``, "as the Trainer does for the loss") makes it weigh W x its coefficient, while
the loss call beside it, whose tokens weigh 1 over the window on every rank, is right: an
MoE router or z-loss scaled by W (transformers#48690, Megatron-LM PR #3768).

Error (F10) only when all of this is proven: every window judged (K >= 2 micro-steps, every
backward the same sum of terms) has a main loss call weighing 1 over the window and
another term that is a per-micro-batch mean or statistic (the rows of that call's input),
divided by K like the main call (a term not divided by K is :mod:`._term_rules`'s) and by
no other constant (a sum divided by a count over all ranks is right times W), whose
constants hold exactly W (``["*", W]``) while the main call's do not; and the loss is built
with a multiplication by the world size (``* world_size``, ``* dist.get_world_size()``, ``*
accelerator.num_processes``) on a line that makes its scale: the backward's line or an
assignment its names come from through arithmetic. A coefficient that only happens to
equal W (``aux * 2`` on two ranks, a distillation temperature T = 2 squared) beside a data
size built from the world size is never judged.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._ledger_source import loss_scalar_lines, world_multiplications
from accumguard.observe._records import Finding, _mk, _n
from accumguard.observe._term_reads import _mean_rows, _window_terms
from accumguard.observe._term_rules import _is_window_mean
from accumguard.observe._weight_rules import _divides_by, _is, _short

__all__ = ["term_world_findings"]


def _times(divs: list[list[Any]], w: int) -> bool:
    return any(str(op) == "*" and _is(float(c), float(w)) for op, c in divs)


def _window_hit(w: dict[str, Any], world: int) -> tuple[list[Any], list[Any]] | None | bool:
    """``(term, main call)`` when window ``w`` shows the pattern, False when it was judged
    and does not, None when it cannot be judged."""
    by_micro = _window_terms(w)
    factor = w.get("rank_factor")
    if by_micro is None or factor is None or not _is(float(factor), 1.0 / world):
        return None
    k = int(w["window"])
    refs: dict[int, dict[int, list[Any]]] = {}
    for m, rs in by_micro.items():
        for r in rs:
            if r[7] is not None and not r[6]:
                refs.setdefault(int(r[2]), {})[m] = r
    main = next(((o, rm) for o, rm in sorted(refs.items()) if len(rm) == k
                 and _is_window_mean(w, rm[0], k)), None)
    if main is None:
        return None
    o_main, rm = main
    if any(_times(r[4], world) for r in rm.values()):
        return None  # the whole loss times W: the ledger's to judge
    rows = int(rm[0][9])
    judged = False
    for o in sorted({int(r[2]) for r in by_micro[0]} - {o_main}):
        recs = [next((r for r in by_micro[m] if int(r[2]) == o), None) for m in range(k)]
        if any(r is None or r[6] for r in recs):
            continue
        terms = [r for r in recs if r is not None]
        # a mean of its own rows (a mean node or a recorded mean call), divided by K and by
        # nothing else: a division by a count (``z.sum() / n_global * world_size``, a count
        # summed over ranks) makes the W right, and is not judged
        mean = all((bool(r[10]) if r[7] is not None else _mean_rows(r, rows, k) is not None)
                   and _divides_by(r[4], k)
                   and all(str(op) != "/" or _is(float(c), float(k)) or _is(float(c), 1.0)
                           for op, c in r[4]) for r in terms)
        if not mean:
            continue
        judged = True
        if all(_times(r[4], world) for r in terms):
            return terms[0], rm[0]
    return False if judged else None


def term_world_findings(rank: int, windows: list[dict[str, Any]], world: int
                        ) -> list[Finding]:
    """F10 for a term multiplied by the world size beside a right loss call (module doc)."""
    if world < 2:
        return []
    found: list[tuple[dict[str, Any], list[Any], list[Any]]] = []
    for w in windows:
        hit = _window_hit(w, world)
        if hit is None:
            continue
        if hit is False:
            return []  # judged without the pattern: not in every window
        term, ref = hit  # type: ignore[misc]
        found.append((w, term, ref))
    if not found:
        return []
    w, term, ref = found[0]
    site = str(term[11]) if len(term) > 11 and term[11] else ""
    file, _, at = site.rpartition(":")
    # a multiplication by W that builds the loss's scale (not a data size elsewhere in the
    # function: ``n = bs * K * num_processes`` beside a KD temperature T = 2 on two ranks)
    scale_lines = loss_scalar_lines(file, int(at)) if file and at.isdigit() else frozenset()
    lines = tuple(x for x in world_multiplications(file) if x in scale_lines) if file else ()
    if not lines:
        return []
    k = int(w["window"])
    coef = " x ".join(f"{float(c):g}" for op, c in term[4] if str(op) == "*")
    what = (f"the loss call at {_short(str(term[7]))}" if term[7] is not None else
            f"a term built from torch ops (its graph starts at {term[3]}, a mean or "
            f"statistic of the {int(ref[9])} rows of the micro-batch)")
    where = _short(file + ":" + ",".join(str(x) for x in lines[:3]))
    return [_mk("F10", "error", rank, int(w["step"]), None,
                f"{what} of the loss backpropagated at {_short(site)} is one term of a sum "
                f"whose other term, the loss call at {_short(str(ref[7]))}, weighs its tokens "
                f"1 in total over each window on every rank; this term is divided by K = {k} "
                f"like it but also multiplied by exactly W = {world} (its constants: x {coef}; "
                f"{where} multiplies by the world size), in every one of the {len(found)} "
                f"window(s) judged (first: optimizer step {_n(w['step'])}). The engine already "
                f"averages the {world} ranks' gradients, which gives a per-micro-batch mean "
                "its large-batch weight: this term weighs "
                f"{world}x what its coefficient gives the large batch",
                title_=f"a term of the loss is multiplied by the world size: it weighs "
                       f"{world}x its coefficient",
                fix="Do not multiply that term by the world size: DDP, FSDP2 and DeepSpeed "
                    "average the ranks' gradients, which already makes a per-micro-batch "
                    "mean the large batch's. Only a loss normalised by a count summed over "
                    "all ranks (the window's global token count) is multiplied by W, and "
                    "then only that term. If the larger weight is wanted, write it into the "
                    "coefficient.")]
