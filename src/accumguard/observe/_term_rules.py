"""Rules on the per-term record (:mod:`._losses_terms`), per rank (pure Python, no torch):

* **A term of the loss not divided by K** while the loss call beside it is. In every
  backward of a window of K micro-steps the loss is a sum of terms; one term is a recorded
  loss call whose tokens weigh 1 in total over the window (the main loss is the large
  batch's mean: a mean divided by K, a sum divided by the window's count, or on DDP a sum
  times W divided by the window's count all-reduced over ranks, whose tokens weigh 1 only
  across ranks: the loss-weight ledger's total, :func:`._ledger.window_masses`); another
  term, in every backward too, is a mean over the same micro-batch's rows (a mean node over
  exactly the rows of that call's input, or a recorded mean loss call) or over its valid
  tokens (a masked sum divided by a count equal, in every micro-step, to the main call's
  valid tokens there, the counts taking at least two values: a PaLM z-loss
  ``(lse ** 2 * mask).sum() / mask.sum()``) and nothing divides it by K: summed over the window its gradient
  is the sum of K micro-batch means, K x what its coefficient means for the large batch (an
  MoE router loss added after ``loss / K``). Not judged: a term with a factor that could not
  be read, a term whose constants may hold a 1/K (``aux * (0.01 / K)``: a constant with
  fewer significant digits once multiplied by K), a term that is a sum (its large-batch
  meaning is the sum over micro-batches), anything not in every backward.
* **A term divided by K twice**: the same kind of term divided by K (written as a division)
  once more than the loss call beside it: it weighs 1/K of its coefficient.
* **A scale above the sum that multiplies a mean term too**: constants common to the two
  terms' chains (``(ce_sum / n_window + coef * aux) * W * K`` before the engine's /K) make
  the main call weigh 1 but give the mean term K times their product (a whole number >= 2).

The log-prob selection rule is :mod:`._selection_rules`.
"""

from __future__ import annotations

from typing import Any

from accumguard.observe._mean_terms_rules import mean_terms_findings
from accumguard.observe._records import Finding, _mk, _n, first_per_optimizer
from accumguard.observe._term_reads import (
    _by_count,
    _common,
    _count_divisor,
    _k_divisions,
    _made_of_batch_means,
    _mass,
    _may_hold_k,
    _mean_rows,
    _own,
    _positions,
    _row_mean,
    _row_mean_divisor,
    _shares_divisor,
    _valid_counts,
    _window_terms,
    window_normalised,
    windows_with_terms,
)
from accumguard.observe._weight_rules import WEIGHT_TOL, _divides_by, _is, _short

__all__ = ["Masses", "term_scale_findings"]


# -- a term not divided by K ------------------------------------------------------------------


#: Per optimizer step, per recorded loss call (site, order) that is a term of a sum on every
#: rank: its tokens' total weight in the update over all ranks (the ledger's ``E``) and the
#: tolerance it is read with.
Masses = dict[int, dict[tuple[str, int], tuple[float, float]]]


def term_scale_findings(rank: int, windows: list[dict[str, Any]],
                        masses: Masses | None = None) -> list[Finding]:
    """LOSS_SCALE for a term not divided by K beside a loss call divided by K (module doc),
    judged per optimizer object: a later phase's windows (a large-batch reference run, whose
    loss is written apart) neither prove nor disprove the training's pattern."""
    return first_per_optimizer(
        windows, lambda w: w.get("opt_serial"),
        lambda group: (_term_scale_findings(rank, group, masses) or _penalty_findings(rank, group)
                       or mean_terms_findings(rank, group)))


# -- a penalty on the parameters not divided by K ---------------------------------------------

def _ordinal(by_micro: dict[int, list[list[Any]]], o: int) -> list[list[Any]]:
    """The term records of place ``o`` in each micro-step's sum."""
    return [r for rs in by_micro.values() for r in rs if int(r[2]) == o]


def _penalty_findings(rank: int, windows: list[dict[str, Any]]) -> list[Finding]:
    """LOSS_SCALE for a penalty on the parameters (a term from torch ops on the parameters
    alone: ``l2 * sum(w.pow(2).sum() ...)``) added in every backward of every window of K
    micro-steps, nothing dividing it by K, while the recorded loss call beside it is divided
    by exactly K in every backward: accumulation sums K copies of the penalty's gradient, K
    times its coefficient, where the large batch's loss adds it once. Not judged: a penalty
    whose constants may hold a 1/K (``l2 / K`` folded into one constant), or one not in every
    window seen."""
    found: list[tuple[dict[str, Any], list[Any], list[Any]]] = []
    judged = 0
    for w, by_micro, k in windows_with_terms(windows):
        first = sorted(by_micro[0], key=lambda r: int(r[2]))
        mains = [r for r in first if r[7] is not None and not r[6]]
        pens = [r for r in first if len(r) > 13 and r[13] and r[7] is None and not r[6]]
        if not mains or not pens:
            continue
        judged += 1
        main = next((r for r in mains if all(
            _divides_by(x[4], k) for x in _ordinal(by_micro, int(r[2])))
            or window_normalised(w, r)), None)
        pen = next((r for r in pens if all(
            len(x) > 13 and x[13] and not _k_divisions(x[4], k) and not _may_hold_k(x[4], k)
            for x in _ordinal(by_micro, int(r[2])))), None)
        if main is None or pen is None:
            return []
        found.append((w, pen, main))
    if not found or len(found) != judged:
        return []
    w, pen, main = found[0]
    k = int(w["window"])
    beside = (f"is divided by K = {k}" if not window_normalised(w, main) else
              "gives every token of the window one weight although the micro-steps' counts "
              "differ (a loss normalised over the whole window, as the HF Trainer's "
              "num_items_in_batch does: the Trainer then divides by K no more)")
    coef = 1.0
    for op, c in pen[4] or []:
        coef = coef * float(c) if str(op) == "*" else coef / float(c)
    return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                f"{_short(str(pen[11]))}: the loss of every backward is a sum of terms, one a "
                f"penalty on the parameters alone (its graph starts at {pen[3]} and reaches "
                f"only parameters, times {coef:.4g}), added in each of the K = {k} micro-steps "
                f"of {len(found)} window(s) and never divided by K, while the loss call beside "
                f"it ({_short(str(main[7]))}) {beside}: accumulation sums {k} "
                f"copies of the penalty's gradient, {k} x {coef:.4g} = {k * coef:.4g} per "
                f"optimizer step, where the large batch's loss adds it once ({coef:.4g})",
                title_=f"a penalty on the parameters is not divided by K: it weighs {k}x its "
                       "coefficient",
                fix=f"Divide the penalty by K as well (loss = (data_loss + coef * penalty) / "
                    f"K), or add it once per window (at its last micro-step); if the larger "
                    f"weight is wanted, write the coefficient as {k} x coef so the intent is "
                    "explicit. An optimizer's weight_decay applies it once per step by "
                    "construction. In a LightningModule, add the penalty to the loss "
                    "`training_step` returns (Lightning divides that by "
                    "`accumulate_grad_batches`), not in a `backward` override.")]


def _term_scale_findings(rank: int, windows: list[dict[str, Any]],
                         masses: Masses | None = None) -> list[Finding]:
    hits: dict[int, list[tuple[dict[str, Any], list[Any], list[Any]]]] = {}
    twice: dict[int, list[tuple[dict[str, Any], list[Any], list[Any]]]] = {}
    judged: dict[int, int] = {}
    counted: dict[int, set[float]] = {}  # per term, the valid counts that divided it
    # per term: (window, record, reference, K x the constants above the sum)
    scaled: dict[int, list[tuple[dict[str, Any], list[Any], list[Any], int]]] = {}
    means: dict[int, list[tuple[dict[str, Any], list[Any], list[Any]]]] = {}
    counted_means: dict[int, set[float]] = {}
    for w, by_micro, k in windows_with_terms(windows):
        # ordinal -> per micro-step: a recorded loss call (a mean divided by K, or a sum
        # divided by the window's count) ...
        refs: dict[int, dict[int, list[Any]]] = {}
        for m, rs in by_micro.items():
            for r in rs:
                if r[7] is not None and not r[6]:
                    refs.setdefault(int(r[2]), {})[m] = r
        # ... whose tokens weigh 1 in total over the window: the large batch's mean (a main
        # loss that is not is the scale rules' to judge)
        # of several calls that qualify (a distillation term is a recorded call too), the
        # one divided by K the fewest times: a term divided once more is the one to judge
        mains = [(_k_divisions(rm[0][4], k), o, rm) for o, rm in sorted(refs.items())
                 if len(rm) == k and len({(str(r[7]), int(r[8])) for r in rm.values()}) == 1
                 and _is_window_mean(w, rm[0], k, masses)]
        if not mains:
            continue
        _, o_main, rm = min(mains, key=lambda x: (x[0], x[1]))
        ref = rm[0]
        valid = _valid_counts(w, ref, k)
        # constants above the sum are a scale meant for the main call only when they bring
        # its tokens to exactly 1 over the window; a main call weighing its own coefficient
        # (a GradScaler's 2^14 times its mean / K) gives the common constants no such meaning
        whole = _whole_mean(w, ref, masses)
        ordinals = {int(r[2]) for r in by_micro[0]} - {o_main}
        for o in ordinals:
            recs = [next(r for r in by_micro[m] if int(r[2]) == o) for m in range(k)]
            judged[o] = judged.get(o, 0) + 1
            shared = {_common_factor(r, rm[m], k, valid[m]) for m, r in enumerate(recs)}
            if len(shared) == 1 and None not in shared and shared != {k} and whole:
                # constants above the sum (a W the HF Trainer multiplies the loss by, a scale
                # written around the sum) weigh this mean too: K x their product, not K
                scaled.setdefault(o, []).append((w, recs[0], rm[0], shared.pop() or 0))
                counted.setdefault(o, set()).update(
                    c for m, r in enumerate(recs)
                    if (c := _by_count(_own(r, rm[m]), rm[m], k, valid[m])))
            elif all(_unscaled_mean(r, rm[m], k, valid[m]) for m, r in enumerate(recs)):
                hits.setdefault(o, []).append((w, recs[0], ref))
                counted.setdefault(o, set()).update(
                    c for m, r in enumerate(recs) if (c := _by_count(r, rm[m], k, valid[m])))
            elif all(_twice_divided_mean(r, rm[m], k, valid[m]) for m, r in enumerate(recs)):
                twice.setdefault(o, []).append((w, recs[0], ref))
            elif all((c := _mean_of_means(r, rm[m], k, valid[m])) is not None
                     for m, r in enumerate(recs)):
                means.setdefault(o, []).append((w, recs[0], ref))
                counted_means.setdefault(o, set()).update(
                    c for m, r in enumerate(recs)
                    if (c := _mean_of_means(r, rm[m], k, valid[m])) is not None)
            elif whole and len(fs := {_common_factor(r, rm[m], k, valid[m])
                                      for m, r in enumerate(recs)}) == 1 and None not in fs:
                scaled.setdefault(o, []).append((w, recs[0], ref, fs.pop() or 0))
                counted.setdefault(o, set()).update(
                    c for m, r in enumerate(recs)
                    if (c := _by_count(_own(r, rm[m]), rm[m], k, valid[m])))
    for o, found in sorted(hits.items()):
        if len(found) != judged[o]:
            continue  # the pattern is not in every window judged
        if len(counted.get(o, ())) == 1:
            continue  # a divisor equal to one unchanging count could be a chosen constant
        if _divisor_moved(found):
            continue
        w, x, ref = found[0]
        k = int(w["window"])
        across = not _is_window_mean(w, ref, k)  # a window mean only over all ranks
        other = "the masked sum" if str(ref[3]) == "masked sum" else "the loss call"
        beside = (f"{other} beside it is divided by K = {k}" if _divides_by(ref[4], k)
                  else f"{other} beside it is normalised over the whole window of K = "
                  f"{k} micro-steps (by the window's token count"
                  + (" all-reduced over ranks, times the world size" if across else
                     ", as the HF Trainer's `num_items_in_batch` does") + ")")
        return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                    _text(found, x, ref, k, masses),
                    title_=f"a term of the loss is not divided by K: it weighs {k}x its "
                           "coefficient",
                    fix=f"Divide that term by K as well (e.g. loss = (ce + coef * aux) / K, "
                        f"or add coef * aux / K): {beside}, this term is not, so "
                        f"accumulation sums {k} micro-batch means of it."
                        + ("" if _divides_by(ref[4], k) else
                           " Better, normalise it the same way: its sum over the valid "
                           "tokens divided by the window's count (in a Trainer "
                           "`compute_loss`: `term_per_token.sum() / num_items_in_batch`), "
                           "so each token weighs the same whatever its micro-batch.")
                        + " With the HF "
                        "Trainer and a Mixture-of-Experts model that adds its router loss "
                        "itself (`router_aux_loss_coef * aux_loss` at every micro-step), "
                        "set `model.config.router_aux_loss_coef` to the coefficient / K. If "
                        f"the larger weight is wanted, write the coefficient as {k} x coef / "
                        "K so the intent is explicit.")]
    for o, found_s in sorted(scaled.items()):
        if len(found_s) != judged[o] or len({f for *_, f in found_s}) != 1 \
                or len(counted.get(o, ())) == 1:
            continue
        w, x, ref, n = found_s[0]
        return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                    _common_text(found_s, x, ref, n),
                    title_=f"a scale meant for the loss beside it also multiplies a term: it "
                           f"weighs {n}x its coefficient",
                    fix="Apply the scale only to the term normalised by the window's count "
                        "(e.g. loss = ce_sum * scale / window_count + coef * aux): a "
                        "per-micro-batch mean term is already right once the engine divides "
                        "by K and averages over the ranks. Or normalise this term like the "
                        "one beside it: sum it over its valid tokens and divide by the same "
                        "window count (with the HF Trainer: by `num_items_in_batch`, which "
                        "the Trainer then multiplies by the number of processes).")]
    for o, found in sorted(means.items()):
        if len(found) != judged[o] or len(counted_means.get(o, ())) < 2:
            continue  # equal counts everywhere: the mean of means is the large batch's mean
        w, x, ref = found[0]
        k = int(w["window"])
        counts = _valid_counts(w, ref, k)
        return [_mk("F5", "error", rank, int(w["step"]), None,
                    f"a term built from torch ops (its graph starts at {x[3]}) is, in every "
                    f"micro-step of {len(found)} window(s), a masked mean over exactly the "
                    f"valid tokens of the loss beside it ({', '.join(str(c) for c in counts)} "
                    f"in the {k} micro-steps of optimizer step {_n(w['step'])}) divided by K = "
                    f"{k}, while that loss, {_ref_words(ref)}, is normalised once over the "
                    f"whole window's {sum(counts)} tokens: this term's tokens weigh (times its "
                    "coefficient) "
                    f"1/(K x their micro-batch's count), {1 / (k * max(counts)):.4g} to "
                    f"{1 / (k * min(counts)):.4g}, instead of 1/{sum(counts)} each: a mean of "
                    "micro-batch means, not the large batch's mean",
                    title_="a term of the loss is a mean of per-micro-batch means",
                    fix="Normalise that term like the loss beside it: sum it over the valid "
                        "tokens and divide by the window's token count (all micro-steps, and "
                        "all ranks when the engine averages over them), e.g. "
                        "(term * mask).sum() / window_tokens instead of "
                        "(term * mask).sum() / mask.sum() / K.")]
    for o, found in sorted(twice.items()):
        if len(found) != judged[o]:
            continue
        w, x, ref = found[0]
        k = int(w["window"])
        return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                    _twice_text(found, x, ref, k),
                    title_=f"a term of the loss is divided by K twice: it weighs 1/{k} of its "
                           "coefficient",
                    fix=f"Divide that term by K = {k} once, as the loss beside it is: remove "
                        "the division written in the loss function when the engine already "
                        "divides the whole loss by the accumulation steps (DeepSpeed's "
                        "engine.backward, Accelerate's accelerator.backward, the HF Trainer "
                        "without num_items_in_batch), or the engine's when the loss is scaled "
                        "by hand.")]
    return _torch_terms_findings(rank, windows)


# -- a loss built from torch ops only: a mean term not divided by K beside ones that are ------

def _torch_terms_findings(rank: int, windows: list[dict[str, Any]]) -> list[Finding]:
    """LOSS_SCALE for a loss built from torch ops only (no recorded loss call: a PPO
    objective, ``pg / K + vf * v / K - ent * e``): in every backward of every window judged,
    some terms are means over the micro-batch's rows divided by exactly K once, and a term
    that is a mean over the same number of elements is not divided by K (no constant of it
    may hold a 1/K, every factor read): relative to the terms beside it, accumulated over
    the window, it weighs K times its coefficient. A loss with a recorded call is
    :func:`term_scale_findings`' own."""
    hits: dict[int, list[tuple[dict[str, Any], list[Any], list[list[Any]]]]] = {}
    judged = 0
    for w in windows:
        by_micro = _window_terms(w)
        if by_micro is None or any(r[7] is not None for rs in by_micro.values() for r in rs):
            continue
        k = int(w["window"])
        judged += 1
        found: dict[int, list[tuple[list[Any], list[list[Any]]]]] = {}
        for m in range(k):
            rs = sorted(by_micro[m], key=lambda r: int(r[2]))
            refs = [r for r in rs if not r[6] and r[5] and int(r[5][0]) >= 2
                    and _k_divisions(r[4], k) == 1]
            for r in rs:
                if r in refs or r[6] or not r[5] or _divides_by(r[4], k) \
                        or _may_hold_k(r[4], k):
                    continue
                same = [x for x in refs if int(x[5][0]) == int(r[5][0])]
                if same:
                    found.setdefault(int(r[2]), []).append((r, same))
        for o, pairs in found.items():
            if len(pairs) == k:
                hits.setdefault(o, []).append((w, pairs[0][0], pairs[0][1]))
    for _o, got in sorted(hits.items()):
        if len(got) != judged:
            continue  # not in every window judged
        w, x, refs = got[0]
        k = int(w["window"])
        coef = _coef_text(x[4], set())
        where = f" of the loss backpropagated at {_short(str(x[11]))}" if x[11] else ""
        beside = (f"whose term starting at {refs[0][3]} (a mean over as many elements) is"
                  if len(refs) == 1 else
                  f"whose {len(refs)} terms starting at {', '.join(str(r[3]) for r in refs)} "
                  "(means over as many elements) are")
        return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                    f"a term built from torch ops (its graph starts at {x[3]}, a mean over "
                    f"{int(x[5][0])} elements){where} is one term of a sum {beside} divided "
                    f"by K = {k}; this term is multiplied by {coef} and not divided by K in any "
                    f"of the {k} micro-steps of {len(got)} window(s) (first: optimizer step "
                    f"{_n(w['step'])}): accumulated, its gradient is the sum of {k} "
                    f"micro-batch means, {k}x its weight relative to the terms beside it "
                    f"(an effective coefficient of {k} x {coef})",
                    title_=f"a term of the loss is not divided by K: it weighs {k}x its "
                           "coefficient",
                    fix=f"Divide that term by K as well (e.g. loss = (pg + vf * v - ent * e) "
                        f"/ K): the terms beside it are divided by K = {k}, this one is not, "
                        f"so accumulation sums {k} micro-batch means of it. If the larger "
                        f"weight is wanted, write the coefficient as {k} x coef / K so the "
                        "intent is explicit.")]
    return []


def _common_factor(r: list[Any], ref: list[Any], k: int, valid: int) -> int | None:
    """For a per-micro-batch mean term (over the rows or the valid tokens) sharing constants
    above the sum with the window-mean loss call ``ref``: K times their product, when that
    is a whole number >= 2 (a scale such as W x K that undoes the engine's /K and average for
    a term normalised by the window's count, applied to this mean too: it weighs that many
    times its coefficient); else None."""
    common = _common(r, ref)
    if r[6] or not common:
        return None
    product = 1.0
    for op, c in common:
        product = product / float(c) if str(op) == "/" else product * float(c)
    if product < 1.0 or not _is(product, float(round(product))):
        return None  # equal coefficients of the two terms (0.5 * ce + 0.5 * kd), no scale
    own = _own(r, ref)
    if not (_row_mean(own, ref, k) or _by_count(own, ref, k, valid) is not None):
        return None
    f = float(k)
    for op, c in common:
        f = f / float(c) if str(op) == "/" else f * float(c)
    n = round(f)
    return n if n >= 2 and _is(f, float(n)) else None


def _common_text(found: list[tuple[dict[str, Any], list[Any], list[Any], int]], x: list[Any],
                 ref: list[Any], n: int) -> str:
    w = found[0][0]
    k = int(w["window"])
    what = (f"the loss call at {_short(str(x[7]))}" if x[7] is not None else
            f"a term built from torch ops (its graph starts at {x[3]}, a mean over the "
            "micro-batch)")
    where = f" of the loss backpropagated at {_short(str(x[11]))}" if len(x) > 11 and x[11] \
        else ""
    common = ", ".join(f"{op} {float(c):g}" for op, c in _common(x, ref))
    return (f"{what}{where} is one term of a sum whose other term, {_ref_words(ref)}, "
            "weighs its tokens 1 in total over each window (the large batch's mean); the "
            f"constants above the sum ({common}) multiply both, and this term is a mean over "
            f"its micro-batch in every one of the {k} micro-steps of {len(found)} window(s) "
            f"(first: optimizer step {_n(w['step'])}): accumulated over K = {k} micro-steps "
            f"it weighs K x those constants = {n} x what its own coefficient gives the large "
            "batch")


def _twice_divided_mean(r: list[Any], ref: list[Any], k: int, valid: int) -> bool:
    """Term ``r`` is a per-micro-batch mean (over the rows, or a masked mean over the valid
    tokens, of the loss call ``ref`` beside it) divided by exactly K at least twice, once
    more than ``ref`` is: summed over the window it weighs ``K ** (1 - n)`` of its
    coefficient (``kd / K`` written in the loss while the engine divides by K too)."""
    n = _k_divisions(r[4], k)
    if r[6] or n < 2 or n != _k_divisions(ref[4], k) + 1:
        return False
    if sum(1 for op, c in r[4] if str(op) == "/" and _is(float(c), float(k))) < 2:
        return False  # a factor 1/K may be a coefficient the user chose (0.25 * ce, K = 4)
    rest = [*r[:4], [d for d in r[4] if not _k_divisions([d], k)], *r[5:]]
    return _row_mean(rest, ref, k) or _by_count(rest, ref, k, valid) is not None


def _mean_of_means(r: list[Any], ref: list[Any], k: int, valid: int) -> float | None:
    """The micro-step's valid-token count when term ``r`` is a masked mean over exactly
    those tokens divided by K once more than ``ref`` is, ``ref`` being normalised over the
    whole window (no division by K): a per-micro-batch mean beside a window-count mean."""
    if r[6] or _k_divisions(ref[4], k) != 0 or _k_divisions(r[4], k) != 1:
        return None
    if sum(1 for op, c in r[4] if str(op) == "/" and _is(float(c), float(k))) != 1:
        return None  # a factor 1/K may be a coefficient the user chose
    rest = [*r[:4], [d for d in r[4] if not _k_divisions([d], k)], *r[5:]]
    # (the exact valid count decides, before any reading as a mean over whole rows: 88
    # tokens of 4 rows is also 22 x the rows)
    count = _count_divisor(rest, valid, k)
    if count is None:
        return None
    others = [d for d in rest[4] if not (str(d[0]) == "/" and float(d[1]) == count)]
    return None if _may_hold_k(others, k, int(ref[9])) else count


def _twice_text(found: list[tuple[dict[str, Any], list[Any], list[Any]]], x: list[Any],
                ref: list[Any], k: int) -> str:
    w = found[0][0]
    n = _k_divisions(x[4], k)
    what = (f"the loss call at {_short(str(x[7]))}" if x[7] is not None else
            f"a term built from torch ops (its graph starts at {x[3]}, a mean over the "
            "micro-batch)")
    where = f" of the loss backpropagated at {_short(str(x[11]))}" if len(x) > 11 and x[11] \
        else ""
    return (f"{what}{where} is one term of a sum whose other term, {_ref_words(ref)}, is "
            f"divided by K = {k} {_k_divisions(ref[4], k)} time(s) "
            f"and weighs its tokens 1 in total over each window (the large batch's mean); this "
            f"term, a mean of its micro-batch, is divided by K {n} times in every one of the "
            f"{k} micro-steps of {len(found)} window(s) (first: optimizer step "
            f"{_n(w['step'])}; constants read from the graph: "
            + ", ".join(f"{op} {float(c):g}" for op, c in x[4])
            + f"): accumulated, it weighs 1/{k ** (n - 1)} of what its coefficient gives the "
            "large batch")


def _ref_words(ref: list[Any]) -> str:
    """The reference term in words: a loss call, or a masked sum built by hand."""
    if str(ref[3]) == "masked sum":
        return ("the masked sum (objective * mask).sum() of the loss backpropagated at "
                f"{_short(str(ref[7]))}")
    return f"the loss call at {_short(str(ref[7]))}"


def _global_mass(w: dict[str, Any], ref: list[Any], masses: Masses | None) -> bool:
    """Over all ranks the reference call's tokens weigh 1 in total in the update (the
    ledger's total, the engine's average included: a sum times W over the window's
    all-reduced count)."""
    got = (masses or {}).get(int(w["step"]), {}).get((str(ref[7]), int(ref[8])))
    return got is not None and abs(got[0] - 1.0) <= got[1]


def _whole_mean(w: dict[str, Any], ref: list[Any], masses: Masses | None) -> bool:
    """The reference call's tokens weigh exactly 1 in total over the window, on this rank or
    over all ranks (not merely its coefficient)."""
    mass = _mass(w, str(ref[7]), int(ref[8]))
    return mass is not None and (abs(mass - 1.0) <= WEIGHT_TOL or _global_mass(w, ref, masses))


def _is_window_mean(w: dict[str, Any], ref: list[Any], k: int,
                    masses: Masses | None = None) -> bool:
    """The reference call's tokens weigh 1 in total over the window (the large batch's
    mean; on this rank, or over all ranks in the ledger's ``masses``), or, when it is
    divided by K, its coefficient: ``0.5 * ce / K`` beside a distillation term weighs 0.5,
    the coefficient the user chose for the large batch; likewise a sum divided by the
    window's token count on this rank (``0.5 * ce_sum / num_items_in_batch``)."""
    mass = _mass(w, str(ref[7]), int(ref[8]))
    if mass is None:
        return False
    if abs(mass - 1.0) <= WEIGHT_TOL or _global_mass(w, ref, masses):
        return True
    if ref[6]:
        return False
    if _divides_by(ref[4], k):
        normaliser = float(k)  # the product of the constants but one division by K
    else:
        window = float(sum(_valid_counts(w, ref, k)))
        if ref[10] or window <= 0 or not any(
                str(op) == "/" and _is(float(c), window) for op, c in ref[4]):
            return False
        normaliser = window  # ... or but its division by the window's count
    coef = normaliser
    for op, c in ref[4]:
        coef = coef / abs(float(c)) if str(op) == "/" else coef * abs(float(c))
    return coef > 0 and abs(mass / coef - 1.0) <= WEIGHT_TOL


def _divisor_moved(found: list[tuple[dict[str, Any], list[Any], list[Any]]]) -> bool:
    """Term records read as a mean over the micro-batch's rows whose divisions changed from
    window to window while the rows did not: a count of the data (the window's labelled
    targets, 5 in one window and 6 in the next, beside 5 rows), which equals the rows, or a
    multiple of positions, only by chance; a mean over rows divides by the same number
    whenever the rows are the same. (A division by the valid tokens of the loss beside it,
    a masked mean, is read as that count, not as rows, and is left out.)"""
    seen: dict[int, set[frozenset[float]]] = {}
    for w, x, ref in found:
        if x[7] is None:
            valid = _valid_counts(w, ref, int(w["window"]))[0]
            divs = frozenset(float(c) for op, c in x[4]
                             if str(op) == "/" and float(c) != float(valid))
            seen.setdefault(int(ref[9]), set()).add(divs)
    return any(len(v) > 1 for v in seen.values())


def _unscaled_mean(r: list[Any], ref: list[Any], k: int, valid: int = 0) -> bool:
    """Term ``r`` of one backward is a mean over the rows of the reference call's input
    (``ref``) or over its ``valid`` tokens (:func:`_by_count`), every factor read, and
    nothing divides it by K."""
    if r[6] or _divides_by(r[4], k) or _shares_divisor(r, ref):
        return False
    return _row_mean(r, ref, k) or _by_count(r, ref, k, valid) is not None


def _coef_text(divs: list[list[Any]], counts: set[float], rows: int = 0, k: int = 0) -> str:
    """The constants a term is multiplied and divided by, in words (``0.02 x 4 / 2``), but
    the divisions that make it a mean (by its count, or by a whole multiple of the rows)."""
    mul = [f"{float(c):g}" for op, c in divs if str(op) == "*" and float(c) != 1.0]
    div = [f"/ {float(c):g}" for op, c in divs if str(op) == "/" and float(c) != 1.0
           and float(c) not in counts and not (k and _row_mean_divisor(float(c), rows, k))
           and not (rows and float(c).is_integer() and _positions(int(c), rows))]
    return " ".join([" x ".join(mul) or "1", *div])


def _positions_text(c: int, rows: int) -> str:
    m = _positions(c, rows)
    pos = c // m
    return (f"{c} rows, " + (f"{m} x " if m > 1 else "") + f"the micro-batch's {pos} positions "
            f"(its {rows} tokens before the loss beside it dropped one position of each of its "
            f"{pos - rows} sequences)")


def _text(found: list[tuple[dict[str, Any], list[Any], list[Any]]], x: list[Any],
          ref: list[Any], k: int, masses: Masses | None = None) -> str:
    w = found[0][0]
    valid = _valid_counts(w, ref, k)[0]
    count = _by_count(x, ref, k, valid)
    rows = int(ref[9])
    coef = _coef_text(x[4], {count} if count is not None else set(), rows, k)
    over = (_mean_rows(x, rows, k) or rows) if x[7] is None else rows
    span = (f"the {rows} rows of the micro-batch" if over == rows else
            _positions_text(over, rows) if _positions(over, rows) else
            f"{over} rows, {over // rows}x the micro-batch's {rows}" if over > rows else
            f"{over} items of {rows // over} of the micro-batch's {rows} rows each (its "
            "sequences, when the loss beside it took the tokens flattened)")
    made = x[7] is None and count is None and not [c for c in x[5] if int(c) >= rows and int(c) % rows == 0] \
        and _made_of_batch_means(x, rows)
    what = (f"the loss call at {_short(str(x[7]))}" if x[7] is not None else
            f"a term built from torch ops (its graph starts at {x[3]}, a masked mean over "
            f"the micro-batch's valid tokens: "
            + ("averaged" if x[5] else "divided")
            + " in every micro-step over exactly the valid tokens of the loss call beside "
            f"it, {count:g} in the first)"
            if count is not None else
            f"a term built from torch ops (its graph starts at {x[3]}, computed from means "
            f"over the {rows} rows of the micro-batch: a statistic of the micro-batch)" if made
            else f"a term built from torch ops (its graph starts at {x[3]}, a mean over {span})")
    by_k = f"is divided by K = {k} and " if _divides_by(ref[4], k) else ""
    where = f" of the loss backpropagated at {_short(str(x[11]))}" if len(x) > 11 and x[11] \
        else ""
    mass = _mass(w, str(ref[7]), int(ref[8]))
    weighs = ("1 in total over each window (the large batch's mean)"
              if mass is None or abs(mass - 1.0) <= WEIGHT_TOL else
              "1 in total over each window across the ranks once the engine averages them "
              "(the large batch's mean)" if _global_mass(w, ref, masses) else
              f"{mass:.4g} in total over each window (its coefficient times the large "
              "batch's mean)")
    return (f"{what}{where} is one term of a sum whose other term, {_ref_words(ref)}, "
            f"{by_k}weighs its tokens {weighs}; this term is multiplied by {coef} "
            f"and not divided by K in any of the {k} micro-steps of {len(found)} window(s) "
            f"(first: optimizer step {_n(w['step'])}): accumulated, its gradient is the sum of "
            f"{k} micro-batch {'values' if made else 'means'}, {k}x what its coefficient "
            "gives the large batch "
            f"(an effective coefficient of {k} x {coef})")
