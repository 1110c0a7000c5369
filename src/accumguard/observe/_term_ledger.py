"""The loss-weight ledger per term: when a micro-step's loss is a sum of terms (CE plus an
auxiliary, router or distillation term, two heads), each recorded loss call that is a term
is judged on its own across ranks (F10: a term divided by the global count and averaged by
the engine again; LOSS_SCALE: divided by the window's count and by K as well), then per rank
by the term rules (:mod:`._term_rules`, :mod:`._term_world_rules`, ...). The whole-loss
ledger is :mod:`._ledger`, whose engine factor this module shares (pure Python, no torch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from accumguard.observe._hand_mean_rules import hand_mean_findings, hand_mean_rank_findings
from accumguard.observe._ledger import _factor
from accumguard.observe._ledger_patterns import ENGINES
from accumguard.observe._ledger_source import world_divisions
from accumguard.observe._own_count_terms import own_count_term_findings
from accumguard.observe._records import (
    Finding,
    RunRecording,
    StepWindow,
    _mk,
    _n,
    _windows,
    window_lines,
)
from accumguard.observe._selection_rules import selection_findings
from accumguard.observe._seq_rules import sequence_mean_findings
from accumguard.observe._split_terms_rules import split_term_findings
from accumguard.observe._term_reads import SELECT_KEY
from accumguard.observe._term_rules import Masses, term_scale_findings
from accumguard.observe._term_world_rules import term_world_findings
from accumguard.observe._twice_window_terms import twice_window_term_findings
from accumguard.observe._weight_rules import WEIGHT_TOL, WEIGHT_TOL_LOW_PRECISION, _short

__all__ = ["term_findings", "window_masses"]


def term_findings(rec: RunRecording) -> list[Finding]:
    """The per-term rules: across ranks (:func:`_rank_term_findings`), then per rank the
    rules of :mod:`._term_rules` (a term not divided by K; a log-prob selection normalised
    over other micro-steps than its window's), each said once, for the first rank that
    shows it."""
    out = _rank_term_findings(rec)
    world = len([r for r in rec.ranks if rec.steps.get(r)])
    for r in rec.ranks:
        found = term_world_findings(r, window_lines(rec.steps.get(r, [])), world)
        if found:
            out += found
            break
    for r in rec.ranks:
        found = twice_window_term_findings(r, window_lines(rec.steps.get(r, [])), world)
        if found:
            out += found
            break
    masses = window_masses(rec)
    for scale_rule in (term_scale_findings, own_count_term_findings):
        found = []
        for r in rec.ranks:
            found = scale_rule(r, window_lines(rec.steps.get(r, [])), masses)
            if found:
                out += found
                break
        if found:
            break
    for r in rec.ranks:
        found = split_term_findings(r, window_lines(rec.steps.get(r, [])))
        if found:
            out += found
            break
    for rule in (selection_findings, sequence_mean_findings, hand_mean_findings):
        for r in rec.ranks:
            lines = window_lines(rec.steps.get(r, []))
            found = hand_mean_findings(r, lines, world) if rule is hand_mean_findings \
                else rule(r, lines)
            if found:
                out += found
                break
    if not any(f.cls in ("F5", "F6") for f in out):
        out += hand_mean_rank_findings({r: window_lines(rec.steps.get(r, [])) for r in rec.ranks})
    return out


def _judged_steps(
        rec: RunRecording, *, selections: bool = False,
) -> Iterator[tuple[int, list[dict[tuple[str, int], list[list[Any]]]], float, float]]:
    """The steps seen on every rank (two or more) in a window without a zero_grad inside,
    with a known engine factor: (step, each rank's loss terms, the factor, the tolerance)."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2:
        return
    per_rank = {r: {w.step: w for w in _windows(rec.steps[r])} for r in ranks}
    for step in sorted(per_rank[ranks[0]]):
        rows = [per_rank[r].get(step) for r in ranks]
        present = [w for w in rows if w is not None and w.window >= 1
                   and not int(w.zero_grads_between)]
        if len(present) != len(rows):
            continue
        groups = [_terms(w) | (_selections(w) if selections else {}) for w in present]
        low = any(bool(x[5]) for g in groups for recs in g.values() for x in recs)
        factor = _factor(present, low)
        if factor is None:
            continue
        yield step, groups, factor, WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL


def window_masses(rec: RunRecording) -> Masses:
    """Per step seen on every rank (two or more) with a known engine factor, per loss call
    that is a term of a sum in every micro-step of every rank: its tokens' total weight in
    the update (``E``, 1 for the large batch's mean: a sum times W divided by the window's
    count all-reduced over ranks) and its tolerance."""
    out: Masses = {}
    for step, groups, factor, tol in _judged_steps(rec, selections=True):
        for key in set.intersection(*(set(g) for g in groups)):
            total = sum(abs(float(x[4])) * factor * float(x[3]) for g in groups
                        for x in g[key])
            out.setdefault(step, {})[key] = (total, tol)
    return out


def _selections(w: StepWindow) -> dict[tuple[str, int], list[list[Any]]]:
    """The window's log-prob selections (``select`` term records) with a read divisor and
    one gradient for every token, by (``SELECT_KEY`` + site, order), when every micro-step
    has exactly one of that key: each as [key..., micro, tokens, weight 1/divisor]."""
    k = w.window
    by_key: dict[tuple[str, int], dict[int, list[Any]]] = {}
    for r in w.terms or []:
        if r and r[0] == "select" and r[6] is not None and float(r[6]) > 0 and r[7]:
            by_key.setdefault((SELECT_KEY + str(r[1]), int(r[2])), {}).setdefault(
                int(r[3]), []).append([SELECT_KEY + str(r[1]), int(r[2]), int(r[3]),
                                       int(r[4]), 1.0 / float(r[6]), False])
    return {key: [by_micro[m][0] for m in range(k)] for key, by_micro in by_key.items()
            if sorted(by_micro) == list(range(k)) and all(len(v) == 1 for v in by_micro.values())}


def _rank_term_findings(rec: RunRecording) -> list[Finding]:
    """F10 for one term of a loss that is a sum of terms (a recorded loss call reached
    through an addition: CE + an auxiliary loss, two heads): the term's tokens carried one
    weight on every rank although the ranks' counts differed (the term was divided by a
    count common to all ranks, the global one), nothing multiplied it by a coefficient (no
    multiplication by a constant between the call and the root, read all the way: a user's
    weight would show), and after the engine's average the term's tokens weigh exactly 1/W in total, in
    every step judged. Any coefficient, a term not in every micro-step, an unknown
    reduction: not judged."""
    world = len([r for r in rec.ranks if rec.steps.get(r)])
    seen: dict[tuple[str, int], list[tuple[int, float, bool, list[float], int]]] = {}
    over_world: dict[tuple[str, int], bool] = {}  # every record divided by exactly W
    spoiled: set[tuple[str, int]] = set()
    coefs: dict[tuple[str, int], set[float]] = {}
    for step, groups, factor, tol in _judged_steps(rec):
        for key in set.intersection(*(set(g) for g in groups)):
            recs = [g[key] for g in groups]
            # a coefficient the user chose (times W is no coefficient): divided out, the
            # same in every record, or the term is not judged
            found = {_coefficient(x, world) for rs in recs for x in rs}
            coefs.setdefault(key, set()).update(found)
            # (a record whose constants up to the root were not all read, None: its
            # coefficient is unknown, not 1)
            if len(coefs[key]) != 1 or 0.0 in coefs[key] or any(
                    len(x) > 9 and x[9] is None for rs in recs for x in rs):
                spoiled.add(key)
                continue
            coef = next(iter(coefs[key]))
            ws = [abs(float(x[4])) * factor for rs in recs for x in rs]
            counts = [sum(float(x[3]) for x in rs) for rs in recs]
            total = sum(abs(float(x[4])) * factor * float(x[3]) for rs in recs for x in rs) / coef
            uniform = max(ws) - min(ws) <= tol * max(ws)
            seen.setdefault(key, []).append((step, total, uniform, counts, len(recs[0])))
            slashed = all(any(str(d[0]) == "/" and abs(float(d[1]) - world) < 1e-9
                              for d in (x[9] if len(x) > 9 else None) or []) for rs in recs
                          for x in rs)
            over_world[key] = over_world.get(key, True) and slashed
    out = []
    unproven: list[tuple[str, int]] = []
    for key, obs in sorted(seen.items()):
        if key in spoiled or not all(u for _, _, u, _, _ in obs):
            continue
        coef = next(iter(coefs[key]))
        ks = {k for _, _, _, _, k in obs}
        by_w = all(abs(t * world - 1.0) <= WEIGHT_TOL_LOW_PRECISION for _, t, _, _, _ in obs)
        by_k = coef == 1.0 and len(ks) == 1 and min(ks) >= 2 and all(
            abs(t * k - 1.0) <= WEIGHT_TOL_LOW_PRECISION for _, t, _, _, k in obs)
        if not (by_w or by_k) or (by_w and by_k):
            continue
        proof = next(((st, c) for st, _, _, c, _ in obs if max(c) - min(c) > 0), None)
        if proof is None:
            if by_w and coef == 1.0:
                unproven.append(key)
            continue
        site, idx = key
        st, counts = proof
        if by_k:
            out.append(_count_term_over_k(site, idx, st, counts, len(obs), min(ks), obs[0][0]))
            continue
        out.append(_mk("F10", "error", None, obs[0][0], None,
                       f"{_short(site)}: the loss call there is one term of a sum"
                       + (f" (call {idx + 1} at that line)" if idx else "")
                       + f"; at optimizer step {_n(st)} its tokens carried one weight on "
                       f"every rank while the ranks held "
                       f"{', '.join(f'{v:g}' for v in counts)} of them, so the term was "
                       "divided by a count common to all ranks (the window's global "
                       "count), "
                       + ("no coefficient multiplies it, and after" if coef == 1.0 else
                          f"and besides its coefficient {coef:g} (read in the graph), after")
                       + " the engine's average its tokens weighed 1/W = "
                       f"{1 / world:.4g} in total"
                       + ("" if coef == 1.0 else " (times the coefficient)")
                       + f" in each of {len(obs)} step(s) instead of 1"
                       + ("" if coef == 1.0 else " (times the coefficient)")
                       + f": this term's gradient is {world}x too small relative to its "
                       "large-batch meaning",
                       fix="Multiply the term normalised by the all-reduced token count by "
                           "the world size (the engine averages over ranks), or divide it "
                           "by the per-rank count instead."))
    if unproven and set(unproven) == set(seen) - spoiled:
        out += _sum_over_world(rec, unproven, over_world, {k: seen[k] for k in unproven}, world)
    return out


def _sum_over_world(rec: RunRecording, keys: list[tuple[str, int]],
                    over_world: dict[tuple[str, int], bool],
                    seen: dict[tuple[str, int], list[tuple[int, float, bool, list[float], int]]],
                    world: int) -> list[Finding]:
    """F10 for a loss that is a sum of terms divided as a whole by the world size on top of
    the engine's average: every term weighed exactly 1/W in every step judged, no
    coefficient, every one of its records divided by exactly W at run time, and the loss
    calls' file divides a loss by the world size (a constant 1/W the user chose, ``0.5 *``
    on two ranks, has no such line and is not judged)."""
    if len(keys) < 2 or not all(over_world.get(k) for k in keys):
        return []
    file = keys[0][0].rpartition(":")[0]
    lines = [ln for ln, kind in world_divisions(file) if kind in ("/", "*1/")] if file else []
    if not lines:
        return []
    first = min(obs[0][0] for obs in seen.values())
    steps = min(len(obs) for obs in seen.values())
    kind = next((str(w.get("engine")) for r in rec.ranks for w in rec.steps.get(r, [])[:1]),
                "")
    engine = ENGINES.get(kind, "the engine")
    sites = ", ".join(_short(site) + (f" (call {i + 1})" if i else "") for site, i in keys)
    return [_mk("F10", "error", None, first, None,
                f"the loss is a sum of {len(keys)} terms (loss calls at {sites}); in each of "
                f"{steps} optimizer step(s) judged on {world} ranks, every term "
                f"weighed 1/W = {1 / world:.4g} in total after "
                f"{engine}'s average instead of 1, every micro-step's loss on every rank was "
                f"divided by {world} before its backward, and the script divides the loss "
                f"by the world size ({_short(file + ':' + ','.join(map(str, lines)))}): the "
                f"gradient the optimizer receives is {world}x too small",
                title_="the loss is divided by the world size on top of the engine's average",
                fix=f"Remove the division by the world size: {engine} already averages the "
                    "gradients over the ranks.")]


def _coefficient(x: list[Any], world: int) -> float:
    """The product of the constants multiplying a loss record (``0.5 * tag_loss``) other than
    the world size (times W undoes the engine's average: not a coefficient); 1.0 for none."""
    c = 1.0
    for d in (x[9] if len(x) > 9 else None) or []:
        if str(d[0]) == "*" and float(d[1]) not in (1.0, world):
            c *= abs(float(d[1]))
    return c


def _count_term_over_k(site: str, idx: int, st: int, counts: list[float], steps: int, k: int,
                       first: int) -> Finding:
    """LOSS_SCALE for a term divided by the window's global count and by K as well."""
    return _mk("LOSS_SCALE", "error", None, first, None,
               f"{_short(site)}: the loss call there is one term of a sum"
               + (f" (call {idx + 1} at that line)" if idx else "")
               + f"; at optimizer step {_n(st)} its tokens carried one weight on every rank "
               f"while the ranks held {', '.join(f'{v:g}' for v in counts)} of them, so the "
               "term was divided by a count common to all ranks and micro-steps (the "
               "window's global count), no coefficient multiplies it, and its tokens "
               f"weighed 1/K = {1 / k:.4g} in total in each of {steps} step(s) instead of 1: "
               f"divided by the window's count and by K = {k} as well, this term's gradient "
               f"is {k}x too small relative to its large-batch meaning (and any other term "
               f"of the loss {k}x too heavy beside it)",
               title_=f"a term normalised by the window's token count is divided by K as well: "
                      f"it weighs 1/{k}",
               fix="Multiply that term by K (the Accelerate docs' recipe: sum * K * W / "
                   "window count), or do not let the engine divide it: DeepSpeed's "
                   "engine.backward, Accelerate's accelerator.backward and Lightning divide "
                   "the whole loss by their gradient accumulation steps, which a term "
                   "already normalised over the whole window must undo.")


def _terms(w: StepWindow) -> dict[tuple[str, int], list[list[Any]]]:
    """The window's loss calls that are terms of a sum (not sole), by (site, order), when
    every micro-step has exactly one record of that key."""
    k = w.window
    by_key: dict[tuple[str, int], dict[int, list[Any]]] = {}
    for r in w.losses or []:
        if (len(r) > 8 and r[8]) or (len(r) > 7 and r[7]):
            continue  # made by torch.autograd.grad, or the whole loss (the ledger's)
        by_key.setdefault((str(r[0]), int(r[1])), {}).setdefault(int(r[2]), []).append(r)
    out = {}
    for key, by_micro in by_key.items():
        if sorted(by_micro) == list(range(k)) and all(len(v) == 1 for v in by_micro.values()):
            recs = [by_micro[m][0] for m in range(k)]
            signs = {float(x[4]) > 0 for x in recs}
            if len(signs) == 1 and all(float(x[4]) != 0 for x in recs):
                out[key] = recs
    return out
