"""A rule on the loss records of windows whose micro-steps run **one backward per term**
(pure Python, no torch): one term's backward divided by K, another's not.

A loop may backpropagate the terms of its loss separately, each micro-step running the main
loss's backward and then an auxiliary term's (a Trainer ``training_step`` that calls the
parent, then ``accelerator.backward(consistency)``; a distillation term after the student's
loss). The term rules (:mod:`._term_rules`) judge terms of one backward's sum; here each
term is the whole loss of its own backward. In every window of K >= 2 micro-steps the
backwards alternate over the same call sites (B = b x K backwards, the i-th running the
site of i mod b), each with exactly one recorded mean loss call that is the backward's
whole loss, its constants read all the way. When one site's calls are divided by exactly K
and another's by nothing that may hold K, the second's gradient over the window is the sum
of K micro-batch means: K x the coefficient its own expression states for the large batch.

Not judged: a run with several optimizers (a term may train another optimizer's parameters
at its own rate), a window whose backwards do not cycle through the same sites, a loss whose
constants were not all read or may hold a 1/K (``0.0025 * aux`` with K = 4), a sum (its
large-batch meaning is the sum over micro-batches), a pattern not in every window judged.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, _mk, _n
from accumguard.observe._term_reads import _k_divisions, _may_hold_k
from accumguard.observe._weight_rules import _is, _short

__all__ = ["split_term_findings", "term_cycle"]


def term_cycle(losses: list[list[Any]] | None) -> int | None:
    """b >= 2 when a window's B backwards each hold one loss call and cycle through b call
    sites (the i-th at site ``i mod b``, B = b x K, K >= 2): each backward is one term of
    the micro-step's loss, not the whole of it. None otherwise."""
    by_micro: dict[int, list[list[Any]]] = {}
    for r in losses or []:
        by_micro.setdefault(int(r[2]), []).append(r)
    backs = len(by_micro)
    if backs < 4 or sorted(by_micro) != list(range(backs)) \
            or any(len(rs) != 1 for rs in by_micro.values()):
        return None
    order = [(str(by_micro[i][0][0]), int(by_micro[i][0][1])) for i in range(backs)]
    b = next((n for n in range(2, backs // 2 + 1) if backs % n == 0
              and all(order[i] == order[i % n] for i in range(backs))), None)
    return b if b is not None and len(set(order[:b])) == b else None


def _cycle(w: dict[str, Any]) -> tuple[int, list[tuple[str, int]], dict[tuple[str, int], list[list[Any]]]] | None:
    """(K, the sites in cycle order, each site's K records) for a window whose backwards
    cycle through b sites (:func:`term_cycle`), each holding one sole, fully read mean loss
    call; else None. (The window's own count is its backwards, B: K = B / b.)"""
    if int(w.get("zero_grads_between", 0)) or w.get("optimizer_index") is not None:
        return None
    losses = w.get("losses") or []
    if any(len(r) > 8 and r[8] for r in losses):
        return None  # a micro-step made by torch.autograd.grad
    b = term_cycle(losses)
    if b is None:
        return None
    recs = sorted(losses, key=lambda r: int(r[2]))
    order = [(str(r[0]), int(r[1])) for r in recs[:b]]
    out: dict[tuple[str, int], list[list[Any]]] = {s: [] for s in order}
    for i, r in enumerate(recs):
        if not r[7] or r[9] is None or str(r[6]) != "mean":
            return None
        out[order[i % b]].append(r)
    return len(recs) // b, order, out


def _product(divs: list[list[Any]]) -> float:
    out = 1.0
    for op, c in divs:
        out = out * float(c) if str(op) == "*" else out / float(c)
    return out


def _read_whole(r: list[Any]) -> bool:
    """The call's gradient is its constants' product over its count (a mean whose whole scale
    is read: nothing unread, a GradScaler's factor or an engine's, multiplies it)."""
    return _is(float(r[4]) * float(r[3]), _product(r[9]))


def split_term_findings(rank: int, windows: list[dict[str, Any]]) -> list[Finding]:
    """LOSS_SCALE for a term backpropagated on its own, not divided by K, beside a loss
    divided by K (module doc); [] unless the pattern holds in every window judged."""
    found: list[tuple[dict[str, Any], tuple[str, int], tuple[str, int], list[Any], int]] = []
    judged = 0
    for w in windows:
        got = _cycle(w)
        if got is None:
            continue
        judged += 1
        k, sites, recs = got
        whole = {s: all(_read_whole(r) for r in rs) for s, rs in recs.items()}
        refs = [s for s in sites if whole[s] and all(_k_divisions(r[9], k) == 1 for r in recs[s])]
        bare = [s for s in sites if whole[s] and all(
            _k_divisions(r[9], k) == 0 and not _may_hold_k(r[9], k, int(r[11]) if len(r) > 11 else 0)
            for r in recs[s])]
        if refs and bare:
            found.append((w, refs[0], bare[0], recs[bare[0]][0], k))
    if len(found) < 2 or len(found) != judged or len({(a, b, k) for _, a, b, _, k in found}) != 1:
        return []
    w, ref, term, x, k = found[0]
    coef = _product(x[9])
    cycle = _cycle(w)
    b = len(cycle[1]) if cycle is not None else 2
    return [_mk(
        "LOSS_SCALE", "error", rank, int(w["step"]), None,
        f"each of the K = {k} micro-steps of optimizer step {_n(w['step'])} (and of "
        f"{len(found) - 1} more window(s)) runs {b} backwards, one per term: the loss at "
        f"{_short(ref[0])}, "
        f"divided by K = {k}, and then the mean over {x[10]} at {_short(term[0])} on its own, "
        f"times {coef:g} and not divided by K (its constants were read all the way to the "
        f"backward's root): summed over the window, that term's gradient is the sum of {k} "
        f"micro-batch means, {k}x the weight its coefficient gives it beside the first loss "
        "in the large batch",
        title_=f"a term backpropagated on its own is not divided by K: it weighs {k}x its "
               "coefficient",
        fix=f"Divide that term by K = {k} before its backward, as the loss beside it is (the HF "
            "Trainer: `self.accelerator.backward(term / self.current_gradient_accumulation_"
            "steps)`; a hand loop: `(coef * term / K).backward()`), or add it to the main loss "
            "before the one backward. If the larger weight is wanted, write its coefficient as "
            f"{k} x coef / K so the intent is explicit.")]
