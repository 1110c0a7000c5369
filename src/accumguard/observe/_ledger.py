"""The loss-weight ledger: per optimizer step, the weight each token (sample) of every
micro-step on every rank carries in the update, composed with what the engine does after
the backward, judged against the large batch (pure Python, no torch).

From the loss record (:mod:`._losses`) each rank knows, per micro-step, the valid count
``n`` of its loss call and the weight ``w`` the backward gave each of those tokens. The
engine then multiplies the sum over ranks of the ranks' gradients by ``f`` (1/W for DDP's,
FSDP2's and DeepSpeed's average: :mod:`._reduction`) and the loop may scale the reduced
gradient again (``c``: gradient conservation's scale, e.g. a hand-written all-reduce after
DDP's). One token then weighs ``w·f·c`` in the update, and the large batch gives every
token ``1/N`` (N: the window's tokens over all micro-steps and ranks): the total
``E = Σ n·w·f·c`` is 1.

* ``E`` exactly ``1/W`` (or ``W``) is F10 (error) when the run proves the factor is the
  world size and not a constant the user chose: every token of the window carried one
  weight although the ranks' counts differed (so the loss was divided by a count common to
  all ranks, the window's global one, and the engine averaged it again), or the loss
  call's file divides a loss by the world size (:mod:`._ledger_source`). Otherwise a
  note says that the total was not judged (``0.5 * loss`` on two ranks weighs the same).
* Each rank giving its tokens one weight, the weights differing between ranks while the
  ranks' totals are equal (each rank divided by its own count, the counts unequal) is F6,
  an error with the spread of the weights: common DDP practice, but the measured weights
  prove the update is not the large batch's (F5's mechanism across ranks, and F5 is an
  error).
* Any other constant total is the user's (a loss weight, a sum instead of a mean): a
  note says once that it was not judged. Per-micro-batch means stay F5
  (:func:`._weight_rules.loss_weight_findings`); 1/K and K per rank stay LOSS_SCALE.
* In each micro-step one weight on every rank, each micro-step's tokens over the ranks
  weighing the same total although the micro-steps' counts differ (a count all-reduced
  per micro-step): F5 across the ranks (:func:`_f5_across`).

Only steps seen on every rank, each micro-step's backward being one loss call times
constants (``sole``), are judged; a sum of terms is judged per term by
:func:`._term_ledger.term_findings`. A GradScaler's scale is part of the recorded weights (gradient
conservation does not see its unscale): the total is then that scale, said in the note;
DeepSpeed fp16 (a dynamic loss scale) is not judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accumguard.observe._ledger_patterns import (
    ENGINES,
    LedgerStep,
    f5_across_findings,
    f6_findings,
    total_in_f6,
)
from accumguard.observe._ledger_source import multiplies_by_k, world_divisions
from accumguard.observe._records import (
    Finding,
    RunRecording,
    StepWindow,
    _mk,
    _n,
    _windows,
    engine_summed,
)
from accumguard.observe._split_terms_rules import term_cycle
from accumguard.observe._unit_rules import UnitStep, unit_findings
from accumguard.observe._weight_rules import (
    WEIGHT_TOL,
    WEIGHT_TOL_LOW_PRECISION,
    _short,
    one,
    units,
)

__all__ = ["ledger_findings", "weights_right"]



def _rank_row(w: StepWindow
             ) -> tuple[list[float], list[float], bool, str, list[list[Any]], bool, str,
                        int | None] | None:
    """Per micro-step (weight, count) of a window whose every backward had one loss call,
    whether any was low precision, the site, per micro-step the constants between the
    call's output and the backward's root, and whether every backward was that call times
    constants (``sole``: the weights are the whole loss's), and what the counts count; or
    None."""
    k = w.window
    if k < 1 or int(w.zero_grads_between) or w.grad_hooks:
        return None  # (a parameter's tensor hook may rescale the gradient after the loss)
    by_micro: dict[int, list[Any]] = {}
    for r in w.losses or []:
        if len(r) > 8 and r[8]:
            return None  # made by torch.autograd.grad
        by_micro.setdefault(int(r[2]), []).append(r)
    if sorted(by_micro) != list(range(k)):
        return None
    if any(len(v) != 1 for v in by_micro.values()) or term_cycle(w.losses) is not None:
        return None  # not one loss call per backward, or the backwards cycle through the
        # terms of one loss (CE, then a consistency term on its own): the terms are judged
        # on their own
    recs = [by_micro[m][0] for m in range(k)]
    ws = [float(r[4]) for r in recs]
    if not (all(x > 0 for x in ws) or all(x < 0 for x in ws)):
        return None
    divs = [list(r[9]) if len(r) > 9 and r[9] else [] for r in recs]
    return ([abs(x) for x in ws], [float(r[3]) for r in recs],
            any(bool(r[5]) for r in recs), str(recs[0][0]), divs,
            all(len(r) > 7 and bool(r[7]) for r in recs), units(recs), _per_row(recs))


def _per_row(recs: list[list[Any]]) -> int | None:
    """The elements of each row, d >= 2, when every loss call of the window counts
    elements and holds d of them per row of its input (``mse_loss`` over (m, d) predictions,
    rows recorded): a sum over elements normalised by a count of rows weighs each row's d
    elements 1/N_rows each, a total of d over elements and 1 over rows."""
    ds = set()
    for r in recs:
        if len(r) < 12 or str(r[10]) != "elements" or not isinstance(r[11], int) or r[11] <= 0:
            return None
        n = int(float(r[3]))
        if n % r[11]:
            return None
        ds.add(n // r[11])
    d = ds.pop() if len(ds) == 1 else 1
    return d if d >= 2 else None


def _scale(w: StepWindow, low: bool) -> float | None:
    """``c``: what the loop did to the reduced gradient before the step (1 on DeepSpeed,
    whose gradients live in its buffers; on torch engines only a checked window says)."""
    if w.source == "deepspeed":
        # summed as recorded only through engine.backward (a plain loss.backward()'s ÷GA is
        # in DeepSpeed's output hooks, not in the weights): otherwise unknown
        return 1.0 if engine_summed(w) else None
    cons = w.conservation
    if cons is None or not cons.ok:
        return None
    if float(cons.received) > (WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL):
        return None
    # a norm clip's own factor is not a weight: the large batch clips by its own norm
    return float(cons.scale) / float(cons.clip) if cons.clip > 0 else None


def _factor(rows: Sequence[StepWindow | None], low: bool) -> float | None:
    """``f·c`` of one step, the same on every rank, or None when unknown."""
    present = [w for w in rows if w is not None]
    if len(present) != len(rows):
        return None  # (a step some rank did not record: its factor is unknown)
    factors = {w.rank_factor for w in present}
    f = factors.pop() if len(factors) == 1 else None
    c = _common_scale(present, low)
    return None if f is None or c is None else float(f) * c


def _common_scale(present: Sequence[StepWindow], low: bool) -> float | None:
    """``c`` of one step, the same on every rank, or None."""
    scales = [_scale(w, low) for w in present]
    cs = [c for c in scales if c is not None]
    if not cs or len(cs) != len(scales) or max(cs) - min(cs) > WEIGHT_TOL * max(cs):
        return None
    return sum(cs) / len(cs)


def _units(rows: Sequence[StepWindow | None]) -> list[list[Any]] | None:
    """The FSDP2 units' disagreeing factors when every rank recorded the same ones."""
    seen = [w.rank_factor_units if w is not None else None for w in rows]
    return seen[0] if seen and seen[0] and all(u == seen[0] for u in seen) else None


def _steps(rec: RunRecording) -> list[LedgerStep]:
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2:
        return []
    per_rank = {r: {w.step: w for w in _windows(rec.steps[r])} for r in ranks}
    out = []
    for step in sorted(per_rank[ranks[0]]):
        rows = {r: per_rank[r].get(step) for r in ranks}
        parsed = {}
        for r, w in rows.items():
            row = None if w is None else _rank_row(w)
            if row is None:
                break
            parsed[r] = row
        else:
            low = any(p[2] for p in parsed.values())
            first = rows[ranks[0]]
            assert first is not None
            factor = _factor(list(rows.values()), low)
            mult = 1.0 if factor is None else factor
            weights = {r: [x * mult for x in p[0]] for r, p in parsed.items()}
            counts = {r: p[1] for r, p in parsed.items()}
            total = sum(x * n for r in weights for x, n in zip(weights[r], counts[r],
                                                                  strict=True))
            out.append(LedgerStep(step, weights, counts, total, factor, low, parsed[ranks[0]][3],
                             first.engine, first.optimizer,
                             any(w is not None and w.clips for w in rows.values()),
                             [d for p in parsed.values() for d in p[4]],
                             all(p[5] for p in parsed.values()),
                             _alike([p[6] for p in parsed.values()]) or "units",
                             _common_scale([w for w in rows.values() if w is not None], low)
                             if factor is None else None,
                             _units([w for w in rows.values()]),
                             _alike([p[7] for p in parsed.values()])))
    return out


def _alike(values: list[Any]) -> Any:
    """The one value every rank gave, else None."""
    return values[0] if values and all(v == values[0] for v in values) else None


def weights_right(rec: RunRecording) -> bool:
    """Every step the ledger judges (seen on two or more ranks, the engine's reduction
    known, each backward the loss call times constants) gave its tokens a total weight of 1
    after the engine's reduction: the large batch's mean. One rank's own total says nothing
    then (ranks of unequal counts carry unequal shares of the 1)."""
    judged = [s for s in _steps(rec) if s.factor is not None and s.sole]
    return bool(judged) and all(s.near(s.total, 1.0) or s.per_row_one() for s in judged)


def ledger_findings(rec: RunRecording, k: int | None = None) -> list[Finding]:
    """F10 (error), F6 (error) or a note on the total, from the ledger of every step seen
    on all ranks (see the module docstring). ``k``: the run's K (a total of 1/K or K is the
    LOSS_SCALE rules' to judge, not a constant the user chose)."""
    steps = _steps(rec)
    if not steps:
        return []
    world = len(steps[0].weights)
    out = f6_findings(steps) + f5_across_findings(steps) + unit_findings([
        UnitStep(s.step, s.site, s.total, s.scale, s.units, s.tol, s.sole, s.unit)
        for s in steps if s.factor is None and s.units])
    judged = [s for s in steps if s.factor is not None and s.sole]
    if not judged:
        return out
    if all(s.near(s.total, 1.0) or s.per_row_one() for s in judged):
        return out  # (over elements: each row's d elements summed, a mean over the rows)
    for target in (1.0 / world, float(world)):
        if all(s.near(s.total, target) for s in judged):
            if any(f.cls == "F6" for f in out):
                # each rank normalised by its own count, then the world size applied (the
                # recipe's x W, or a / W): F6's fix (count over all ranks, times W under an
                # averaging engine) sets the total right too; "remove the W" would not
                return [total_in_f6(f, judged[0], target) if f.cls == "F6" else f for f in out]
            if target < 1 and k is not None and k == world > 1 and all(
                    s.divs and all(any(_divides(s, d, "*", float(world)) for d in ds)
                                   and any(_divides(s, d, "/", float(k)) for d in ds)
                                   for ds in s.divs) for s in judged):
                # K = W: the loss was multiplied by the world size (the recipe for a count
                # over all ranks under an averaging engine) and divided by K: the total's
                # 1/W is the division by K, not a W missing or doubled
                return _k_total(judged, world, k, True) + out
            return _f10(judged, world, target, k) + out
    whole = all(len(ws) == k for x in judged for ws in x.weights.values())
    if k is not None and k > 1 and k != world and whole:
        # (windows of K micro-steps: a step after every backward is F1's to say)
        for target, op in ((1.0 / k, "/"), (float(k), "*")):
            if all(s.near(s.total, target) and s.divs and all(
                    any(_divides(s, d, op, float(k)) for d in ds) for ds in s.divs)
                   for s in judged) and (op == "/" or multiplies_by_k(judged[0].site)):
                return _k_total(judged, world, k, target < 1) + out
    totals = [s.total for s in judged]
    s = judged[0]
    if max(totals) - min(totals) <= s.tol * max(totals) and not (
            k is not None and k > 1 and (s.near(s.total, 1.0 / k) or s.near(s.total, float(k)))):
        out.append(_mk("LOSS_SCALE", "note", None, s.step, None,
                       f"{_short(s.site)}: after {ENGINES.get(s.engine, s.engine)}'s reduction "
                       f"the {s.unit} of every step carried a total weight of {s.total:.4g} "
                       f"(the large batch's mean: 1; {len(judged)} step(s) on {world} ranks): "
                       "a constant of the loop (a loss weight, a sum instead of a mean, "
                       "or a GradScaler's loss scale, which the recorded weights include), "
                       "not judged",
                       title_="loss weights total a constant other than 1 (not judged)",
                       fix="Nothing to fix if the constant is intended (a loss weight); for "
                           "the large batch's mean, normalise the summed loss by the window's "
                           f"{one(s.unit)} count over all micro-steps and ranks."))
    return out


def _k_total(judged: list[LedgerStep], world: int, k: int, small: bool) -> list[Finding]:
    """LOSS_SCALE: over all ranks, after the engine's reduction, the tokens of every step
    weigh 1/K (or K) in total, and a constant between the loss and its backward divides
    (multiplies) it by exactly K: the window's normalisation and an accumulation division
    (or product) are applied together where only one belongs."""
    s = judged[0]
    engine = ENGINES.get(s.engine, s.engine)
    over = all(any(_divides(x, d, "/", None) for ds in x.divs for d in ds) for x in judged)
    norm = (f"its normalisation over the window's {s.unit} on all ranks" if over else
            "the rest of its scale")
    how = (f"divided by K = {k} on top of {norm} (a framework "
           "or engine that divides the returned loss by its accumulation steps: Lightning's "
           "automatic optimisation, DeepSpeed's engine.backward, Accelerate's backward, the "
           "HF Trainer without num_items_in_batch)" if small else
           f"multiplied by K = {k} while nothing divides it by K again")
    return [_mk("LOSS_SCALE", "error", None, s.step, None,
                f"{_short(s.site)}: after {engine}'s reduction the {s.unit} of every step "
                f"carried a total weight of {s.total:.4g} over the {world} ranks "
                f"({len(judged)} step(s)), {'1/' if small else ''}{k} where the large batch's "
                f"mean gives 1, and each micro-step's loss was {how}: every update is "
                f"{k}x too {'small' if small else 'large'}",
                title_=f"loss weights total {'1/' if small else ''}{k} over the ranks: the "
                       f"update is K = {k} times too {'small' if small else 'large'}",
                fix=("Multiply the window-normalised loss by K where the engine divides by "
                     "its accumulation steps (Lightning: return loss_sum / window_count * "
                     "world_size * accumulate_grad_batches; Accelerate: loss_sum * "
                     "accelerator.num_processes * accelerator.gradient_accumulation_steps / "
                     "window_count), or let the engine's division stand and normalise per "
                     "micro-step instead." if small else
                     "Remove the factor K: a loss normalised over the window's count needs "
                     "no K when nothing divides it by K."))]


def _divides(x: LedgerStep, d: list[Any], op: str, v: float | None) -> bool:
    """Is the constant ``d`` (``[op, value]``) between a loss call and its backward's root a
    division by ``v`` (``op`` "/"), or a multiplication by ``v`` ("*")? ``v`` None: by the
    step's token count over all ranks (``1 / N`` for "*")."""
    want = v if v is not None else sum(x.rank_counts())
    if v is None and op == "*":
        want = 1.0 / want if want else 0.0
    return str(d[0]) == op and x.near(float(d[1]), want)


def _rank_means(judged: list[LedgerStep]) -> bool:
    """Every rank's units weighed 1 in all before the factor after the backwards (its window's
    mean, whatever constants the loss carried): a total off by W then comes from that factor."""
    return all(x.factor and x.weights and all(
        x.near(sum(w * c for w, c in zip(ws, x.counts.get(r, []), strict=False)) / x.factor, 1.0)
        for r, ws in x.weights.items()) for x in judged)


def _f10(judged: list[LedgerStep], world: int, target: float, k: int | None = None
         ) -> list[Finding]:
    s = judged[0]
    engine = ENGINES.get(s.engine, s.engine)
    small = target < 1
    common = [x for x in judged if all(x.flat(ws) for ws in x.weights.values())
              and x.flat([v for ws in x.weights.values() for v in ws])
              and not x.flat(x.rank_counts())]
    # the source divides (multiplies) a loss by the world size, and at run time every
    # micro-step's loss on every rank was divided (multiplied) by exactly W: not a constant
    # weight that only happens to equal 1/W (0.5 * loss, or loss / 2, on two ranks)
    # (a loss divided by K * W in one operation, ``loss / (K * world)``, whose K part is
    # the window's right mean: the rest is the W the total is off by)
    # (or a summed loss divided by the window's token count over all ranks, ``loss_sum /
    # (micro * K * world)``: a per-step count, the large batch's N, which DDP divides again)
    by = [float(world)] + ([float(k * world)] if k is not None and k > 1 else [])
    forms = {"/": ("/", by), "*1/": ("*", [1.0 / b for b in by])} if small \
        else {"*": ("*", [float(world)])}
    lines, used, global_n = [], float(world), False
    for ln, kind in world_divisions(s.site.rpartition(":")[0]) if ":" in s.site else ():
        op, values = forms.get(kind, ("", []))
        for v in [*values, None] if small else values:
            if all(any(_divides(x, d, op, v) for d in ds) for x in judged for ds in x.divs):
                lines.append(ln)
                global_n = v is None
                used = (v if op == "/" or not small else 1.0 / v) if v is not None else 0.0
                break
    u = s.unit
    seen = (f"{_short(s.site)}: after {engine}'s reduction (x{s.factor:.4g}) the {u} of "
            f"each of {len(judged)} optimizer step(s) on {world} ranks carried a total "
            f"weight of {s.total:.4g} = {'1/W' if small else 'W'} instead of 1 (the large "
            f"batch gives each of its N {u} 1/N)")
    if common:
        c = common[0]
        why = (f"; at optimizer step {_n(c.step)} every {one(u)} of every rank carried the "
               f"same weight while the ranks held {', '.join(f'{v:g}' for v in c.rank_counts())} "
               f"{u}, so the loss was divided by a count common to all ranks, the window's "
               f"global count, and {engine} then averaged the ranks' gradients again")
    elif lines:
        file, _, at = s.site.rpartition(":")
        shown = [int(at)] if at.isdigit() and int(at) in lines else lines
        path = _short(file + ":" + ",".join(str(x) for x in shown))
        by_what = (f"the window's {one(u)} count over all ranks (the large batch's N)"
                   if global_n else f"{world}" if abs(used - world) < 1e-9 else
                   f"{used:g} (K x W = {used / world:g} x {world})")
        why = (f"; every micro-step's loss on every rank was {'divided' if small else 'multiplied'}"
               f" by {by_what} before its backward and the script "
               f"{'divides' if small else 'multiplies'} the loss by "
               f"{'a count with the world size as a factor' if global_n or abs(used - world) > 1e-9 else 'the world size'}"
               f" there ({path})")
    elif s.factor is not None and abs(s.factor * world - 1.0) > 1e-6 \
            and (plain := all(not d for x in judged for d in x.divs)) | (small and _rank_means(judged)):
        # (a total of W under rank means is a sum over the ranks: a summing hook's own rule,
        # or a hand reduction's, says so with the mechanism)
        # no constant between any loss call and its backward, or constants that leave each
        # rank's tokens weighing its own window's mean: the total is the factor applied
        # after the backwards at work, not a weight the loop chose
        how = ("every micro-step's loss was a plain mean (no constant between the loss "
               "call and its backward)" if plain else
               f"each rank's {u} weighed 1 in all before the reduction (the loss was its "
               "window's mean)")
        why = (f"; {how}, and what multiplied the gradients after the backwards ({engine}'s "
               f"reduction, and anything the script did to .grad before the step) gave the sum "
               f"over the ranks a factor of {s.factor:.4g} where an average over the {world} "
               f"ranks is {1 / world:.4g}: a divisor of its own (an FSDP2 "
               f"set_gradient_divide_factor({1 / s.factor:g}), a hook, .grad divided by the "
               "world size by hand under DDP) replaced or repeated the average over the ranks")
    else:
        return [_mk("LOSS_SCALE", "note", None, s.step, None,
                    f"{seen}. That is what a loss divided by the world size gives on top of "
                    f"{engine}'s own average, but also what a constant weight of "
                    f"{target:.4g} the loop chose gives (the ranks' {one(u)} counts are equal, "
                    "and no division of the loss by exactly W at run time matches a division "
                    "by the world size in the loss call's file): not judged",
                    title_=f"loss weights total {'1/W' if small else 'W'} (not judged)",
                    fix=f"If the loss is divided by the world size, remove that division: "
                        f"{engine} already averages over the ranks.")]
    adam = "adam" in s.optimizer.lower() or "lamb" in s.optimizer.lower()
    effect = (f"the gradient the optimizer receives is {world}x too "
              f"{'small' if small else 'large'}: "
              + ("with Adam-type optimizers the update changes through epsilon (the "
                 f"denominator becomes sqrt(v) + {world if small else 1 / world:g}*eps), "
                 "gradient clipping and coupled weight decay only, but it is not the large "
                 "batch's update" if adam else
                 f"every update is {world}x too {'small' if small else 'large'} (with SGD, "
                 f"an effective learning rate of lr{'/' if small else '*'}{world})"))
    if s.clipped:
        effect += f"; the clipping threshold acts on a norm {world}x off"
    return [_mk("F10", "error", None, s.step, None,
                f"{seen}{why}: {effect}",
                fix=(f"Average over ranks exactly once: {engine} already averages the "
                     "gradients, so do not divide the loss by the world size; when "
                     "normalising by the window's token count all-reduced over ranks, "
                     f"multiply the loss by the world size (or, on FSDP2, "
                     "set_gradient_divide_factor(1.0) with "
                     "set_force_sum_reduction_for_comms(True))" if small else
                     (f"A divide factor replaces {engine}'s division by the world size: "
                      "to sum the window's K micro-batch means, set it to K x W (or leave "
                      "the default and divide each micro-step's loss by K)."
                      if s.factor is not None and abs(s.factor * world - 1.0) > 1e-6
                      and not lines and not common else
                      f"Average over ranks exactly once: {engine} already averages; do not "
                      "multiply the loss by the world size on top of a per-rank mean.")))]
