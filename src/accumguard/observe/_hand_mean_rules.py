"""F5 for a loss built by hand as one mean over its micro-batch (``losses.mean()`` of per-pair
DPO losses, ``((out - y) ** 2).mean()``: no recorded loss call), divided by the same constant
in every micro-step while the micro-batches hold different numbers of elements (pure Python,
no torch).

Read from the ``mean`` records (:mod:`._losses_terms`): one per micro-step at one call site,
with the count its mean averaged and the product of the constants above it. Each
micro-batch's mean then weighs the same in the step, so one element (a pair, a sample) of a
micro-batch of n weighs 1/(d n) where the large batch gives every element of the window
1/N: the per-micro-batch mean of F5, for a loss no loss call reveals. A divisor that differs
between micro-steps (``mean * n / N``: normalised by the window's count) is not judged; nor
is a window with a micro-step whose mean was over one element (not recorded as a mean).

F6 for the same loss across ranks: each rank's micro-batches hold equal counts, the ranks'
counts differ (a token budget per rank, length buckets per rank), every rank divides by the
same constant, and the engine averages the ranks' gradients: one element of rank r weighs
1/(d n_r W), so the ranks' means weigh alike where the large batch weighs their elements
alike.

When the means' total weight is off by exactly K, W or K x W (each mean divided by a
constant that is not K: a Trainer's x W undoing DDP's average over a loss that never divided
by K), that is the error: LOSS_SCALE (F10 for W alone), the uneven counts named beside it.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, _mk, _n
from accumguard.observe._weight_rules import _short

__all__ = ["hand_mean_findings", "hand_mean_rank_findings"]

#: Relative difference under which two micro-steps' divisors are one constant (read exactly
#: from the graph: the same Python number gives the same float).
_SAME = 1e-9


def _means(w: dict[str, Any]) -> list[list[Any]] | None:
    """The window's one ``mean`` record per micro-step, at one site and one divisor."""
    k = int(w.get("window", 0))
    if k < 2 or int(w.get("zero_grads_between", 0)) or int(w.get("backwards_per_micro", 1)) != 1:
        return None
    by_micro: dict[int, list[list[Any]]] = {}
    for r in w.get("terms") or []:
        if r and r[0] == "mean" and len(r) >= 5:
            by_micro.setdefault(int(r[1]), []).append(r)
    if sorted(by_micro) != list(range(k)) or any(len(v) != 1 for v in by_micro.values()):
        return None
    recs = [by_micro[m][0] for m in range(k)]
    d = float(recs[0][2])
    if len({str(r[4]) for r in recs}) != 1 or d <= 0 \
            or any(abs(float(r[2]) - d) > _SAME * d for r in recs):
        return None
    return recs


def hand_mean_findings(rank: int, windows: list[dict[str, Any]], world: int = 1) -> list[Finding]:
    """F5 for per-micro-batch means built by hand over uneven counts (module doc); LOSS_SCALE
    (or F10) instead when the means' total weight in the update is off by exactly K, W or
    K x W (see :func:`_total_scale`)."""
    hits = []
    for w in windows:
        recs = _means(w)
        if recs is not None and len({int(r[3]) for r in recs}) > 1:
            hits.append((w, recs))
    if not hits:
        return []
    w, recs = hits[0]
    counts = [int(r[3]) for r in recs]
    d, n = float(recs[0][2]), sum(counts)
    uneven = (f"over {' / '.join(str(c) for c in counts)} elements in the {len(counts)} "
              f"micro-steps of optimizer step {_n(w['step'])}, divided by {d:g} in each "
              f"({len(hits)} window(s) with uneven counts)")
    scaled = _total_scale(w, len(counts), d, world)
    if scaled is not None:
        scale, name, cls = scaled
        return [_mk(cls, "error", rank, int(w["step"]), None,
                    f"{_short(str(recs[0][4]))}: the loss backpropagated there is one mean built "
                    f"by hand (no recorded loss call) {uneven}: the K = {len(counts)} "
                    f"micro-steps' means"
                    + (f" on each of the {world} ranks, averaged by the engine," if world > 1
                       else "")
                    + f" weigh {scale:g} in total where the large batch's mean weighs 1: the "
                    f"update is {name} too large (and each micro-batch's mean weighs the same "
                    "whatever its count)",
                    title_=f"a loss built by hand weighed {name} the large batch's mean",
                    fix=_FIX)]
    return [_mk("F5", "error", rank, int(w["step"]), None,
                f"{_short(str(recs[0][4]))}: the loss backpropagated there is one mean built "
                f"by hand (no recorded loss call) {uneven}: each "
                f"micro-batch's mean weighed the same in the step, so one element weighed "
                f"1/({d:g} x {max(counts)}) to 1/({d:g} x {min(counts)}) instead of 1/{n}, "
                f"the large batch's mean over the window's {n} elements",
                title_="per-micro-batch means weighed alike over uneven counts (a loss built "
                       "by hand)",
                fix=_FIX)]


_FIX = ("Sum the per-element losses of the micro-batch and divide by the number of "
        "elements in the whole window (all micro-steps, and all ranks when the "
        "ranks' gradients are averaged: then times W), counted before the window "
        "starts; under Accelerate or DeepSpeed, times K as well (their backward "
        "divides by K).")


def _total_scale(w: dict[str, Any], k: int, d: float, world: int) -> tuple[float, str, str] | None:
    """(total weight, its name, class) when the window's means weigh exactly K, W or K x W
    (or their inverses, K, W >= 2) in total instead of 1: each micro-step's mean divided by
    ``d``, ``k`` of them per rank, the ranks' sum scaled by the engine's ``rank_factor``
    (1/W for an average). A total of W or 1/W alone is F10 (the ranks' average missing or
    doubled), the others LOSS_SCALE; any other total is a constant the loop chose, not
    judged here (None)."""
    f = w.get("rank_factor")
    if world > 1 and not isinstance(f, (int, float)):
        return None  # what the engine did with the ranks' gradients is not known
    total = k / d * (world * float(f) if world > 1 and f else 1.0)
    names = {k: ("K", "LOSS_SCALE"), 1 / k: ("1/K", "LOSS_SCALE")}
    if world > 1:
        names.update({k * world: ("K x W", "LOSS_SCALE"), 1 / (k * world): ("1/(K x W)", "LOSS_SCALE")})
        if world != k:
            names.update({world: ("W", "F10"), 1 / world: ("1/W", "F10")})
    for value, (name, cls) in names.items():
        if abs(total - value) <= 1e-6 * value:
            return total, f"{value:g}x ({name})", cls
    return None


def hand_mean_rank_findings(steps: dict[int, list[dict[str, Any]]]) -> list[Finding]:
    """F6 for per-micro-batch means built by hand whose counts differ between ranks (module
    doc). ``steps``: each rank's step lines; every rank of the step must show it, with DDP's
    (or another engine's) average over the ranks (``rank_factor`` 1/W)."""
    ranks = sorted(r for r, ss in steps.items() if ss)
    world = len(ranks)
    if world < 2:
        return []
    by_step = [{int(w["step"]): w for w in steps[r] if "step" in w} for r in ranks]
    for step in sorted(by_step[0]):
        rows = [b.get(step) for b in by_step]
        if any(w is None for w in rows):
            continue
        means = [_means(w) for w in rows if w is not None]
        if any(m is None for m in means):
            continue
        recs = [m for m in means if m is not None]
        factors = [w.get("rank_factor") for w in rows if w is not None]
        if any(not isinstance(f, (int, float)) or abs(float(f) * world - 1.0) > 1e-9
               for f in factors):
            continue
        sites = {str(m[0][4]) for m in recs}
        ds = {float(m[0][2]) for m in recs}
        counts = [{int(r[3]) for r in m} for m in recs]
        if len(sites) != 1 or len(ds) != 1 or any(len(c) != 1 for c in counts):
            continue
        per = [next(iter(c)) for c in counts]
        if len(set(per)) < 2:
            continue
        d, k = next(iter(ds)), len(recs[0])
        n = sum(per) * k
        weights = ", ".join(f"rank {r}: 1/{d * c * world:g}" for r, c in zip(ranks, per, strict=True))
        return [_mk("F6", "error", None, step, None,
                    f"{_short(next(iter(sites)))}: the loss backpropagated there is one mean "
                    f"built by hand per micro-batch (no recorded loss call), divided by {d:g} "
                    f"on every rank; at optimizer step {_n(step)} each micro-batch held "
                    + ", ".join(f"{c} element(s) on rank {r}" for r, c in zip(ranks, per, strict=True))
                    + f", and the engine averaged the {world} ranks' gradients: one element "
                    f"weighed {weights} instead of 1/{n}, the large batch's mean over the "
                    f"window's {n} elements (the ranks' means weighed alike)",
                    title_="ranks' per-micro-batch means averaged over uneven counts (a loss "
                           "built by hand)",
                    fix="Sum the per-element losses and divide by the window's element count "
                        "summed over all ranks (all_reduce), times W (the engine averages over "
                        "ranks); under the HF Trainer, return that from compute_loss with "
                        "num_items_in_batch (the window's count over the ranks) and "
                        "model_accepts_loss_kwargs / loss_is_scaled_for_ga set as it expects.")]
    return []
