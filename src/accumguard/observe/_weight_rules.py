"""The rules that read weights and scales: the token-weight probe's verdict
(:mod:`accumguard.observe.tokens`), the loss record's per-token weights (F5;
:mod:`._losses`) and the scale of a whole window (LOSS_SCALE, F1 for a step after every
``autograd.grad``; F7 of a partial window in :mod:`._partial_window_rules`, the whole
loss's scale in :mod:`._scale_rules`); F10 of a hand-written reduction is in
:mod:`._rank_rules`, the weights across ranks composed with the engine's reduction (F10,
F6) in :mod:`._ledger`, F12 in :mod:`._precision_rules`.
:mod:`accumguard.observe.rules` runs them with the boundary rules and re-exports their
public names (pure Python, no torch)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accumguard.core.window import StepRecord
from accumguard.observe._records import Finding, KResolution, StepWindow, _mk, _n

__all__ = ["MASS_TOL", "MASS_TOL_LOW_PRECISION", "WEIGHT_TOL", "WEIGHT_TOL_LOW_PRECISION",
           "classify_token_weights", "grad_step_findings",
           "loss_divisor", "loss_weight_findings", "one", "sized_on_purpose", "units"]

# -- token weights (the probe of :mod:`accumguard.observe.tokens`) -------------------------

#: Relative spread below which token weights count as equal. The probe is exact up to fp32
#: rounding of one logsumexp (~1e-6 relative); real normalisation bugs differ by far more.
WEIGHT_TOL = 1e-3
#: With bf16/fp16 logits the gradient itself carries ~3 significant digits.
WEIGHT_TOL_LOW_PRECISION = 3e-2


def classify_token_weights(ranks: list[list[list[float]]], *, world_size: int,
                           averages_over_ranks: bool, accumulation_steps: int,
                           tol: float = WEIGHT_TOL) -> tuple[str, str] | None:
    """Name what the optimizer received from the probe records of one window:
    ``(class, evidence)``, or None when every valid token carried the weight ``1/N``
    (or there is nothing to judge).

    ``ranks[r]`` is rank r's records ``[n_i, Σ s·(1−p_y), Σ (1−p_y)]``, one per
    micro-step. Classes: F5 (each micro-batch normalised by its own count), F6 (each
    rank by its own count), F10 (off by the world size), F7 (a partial window scaled
    as a full one), LOSS_SCALE (any other factor).
    """
    rows = [(r, i, float(n), float(num), float(den)) for r, recs in enumerate(ranks)
            for i, (n, num, den) in enumerate(recs)]
    rows = [x for x in rows if x[2] > 0 and x[4] > 0]
    if not rows:
        return None
    total = sum(x[2] for x in rows)
    avg = 1.0 / world_size if averages_over_ranks else 1.0
    # w: the weight one token of micro-step i finally carries; exact means w * total == 1.
    ratio = [x[3] / x[4] * avg * total for x in rows]
    counts = [x[2] for x in rows]

    def flat(vals: list[float]) -> bool:
        lo, hi = min(vals), max(vals)
        return hi > 0 and (hi - lo) <= tol * hi

    def near(a: float, b: float) -> bool:
        return abs(a - b) <= tol * abs(b)

    lo, hi = min(ratio), max(ratio)
    if near(lo, 1.0) and near(hi, 1.0):
        return None
    per_micro = [r * n / total for r, n in zip(ratio, counts, strict=True)]  # w_i * n_i
    micro_steps = max(len(recs) for recs in ranks)
    seen = (f"micro-steps with {min(counts):g}..{max(counts):g} valid tokens (N={total:g} over "
            f"{len(rows)} micro-batches on {world_size} rank(s)) gave their tokens weights from "
            f"{lo:.4g}/N to {hi:.4g}/N; exact is 1/N for every token")
    if flat(ratio):
        r = (lo + hi) / 2
        if world_size > 1 and (near(r, world_size) or near(r, 1.0 / world_size)):
            return "F10", f"{seen}: every weight is {r:.4g}/N, off by the world size {world_size}"
        if micro_steps < accumulation_steps and near(r, micro_steps / accumulation_steps):
            return "F7", (f"{seen}: a partial window of {micro_steps} of {accumulation_steps} "
                          "micro-steps normalised as a full one")
        return "LOSS_SCALE", f"{seen}: every weight is {r:.4g}/N"
    if flat(per_micro):
        c = sum(per_micro) / len(per_micro)
        return "F5", (f"{seen}; each micro-step's tokens got the same total weight ({c:.4g}) "
                      f"whatever their count, i.e. a per-micro-batch mean (total weight "
                      f"{c * len(rows):.4g}, exact 1)")
    by_rank: dict[int, list[int]] = {}
    for j, x in enumerate(rows):
        by_rank.setdefault(x[0], []).append(j)
    if len(by_rank) > 1 and all(flat([ratio[j] for j in js]) for js in by_rank.values()):
        rank_mass = [sum(per_micro[j] for j in js) for js in by_rank.values()]
        if flat(rank_mass):
            return "F6", (f"{seen}; each rank's tokens got the same total weight whatever the "
                          "rank's count, i.e. a mean over ranks of rank-local means")
    return "LOSS_SCALE", seen


# -- per-token weights of the loss calls (:mod:`accumguard.observe._losses`) --------------

#: Relative spread below which the total weights of one call site's micro-steps count as
#: equal (the F5 signature). With F5 they are bitwise equal (the same 1/K reached every
#: call) or off by fp32 rounding of 1/(n_i K) (~1e-7); the token weights of a real bug
#: differ by the spread of the counts, kept at least 10x the mass spread (below).
MASS_TOL = 1e-4
MASS_TOL_LOW_PRECISION = 1e-2


def _spread(vals: list[float]) -> float:
    hi = max(abs(v) for v in vals)
    return (max(vals) - min(vals)) / hi if hi > 0 else 0.0


def _loss_groups(w: StepRecord) -> dict[tuple[str, int], dict[int, list[Any]]]:
    """The window's loss records by (call site, order there), then by micro-step."""
    groups: dict[tuple[str, int], dict[int, list[Any]]] = {}
    for r in w.losses or []:
        if len(r) > 8 and r[8]:
            continue  # made by torch.autograd.grad, not a backward of the window
        site, idx, micro = str(r[0]), int(r[1]), int(r[2])
        groups.setdefault((site, idx), {}).setdefault(micro, r)
    return groups


def _per_micro_step(w: StepRecord, k: int) -> Iterator[tuple[str, int, list[Any], int]]:
    """Each loss call site's records with one per micro-step: a site in every backward of
    the window, or, when its records alternate reductions (two backwards per micro-step
    at one site, a clean pass normalised by the window's count and an adversarial pass
    averaged per micro-batch), the records of each reduction when they fall on every b-th
    backward (yielded with ``b``) and are at least two."""
    for (site, idx), by_micro in sorted(_loss_groups(w).items()):
        if len(by_micro) < k or any(m not in by_micro for m in range(k)):
            continue  # not in every micro-step of the window: nothing to compare
        recs = [by_micro[m] for m in range(k)]
        reductions = {str(r[6]) for r in recs}
        if len(reductions) == 1:
            yield site, idx, recs, 1
            continue
        for red in sorted(reductions):
            micro = [m for m in range(k) if str(by_micro[m][6]) == red]
            b = k // len(micro)
            if len(micro) >= 2 and b * len(micro) == k and all(
                    m - micro[0] == i * b for i, m in enumerate(micro)):
                yield site, idx, [by_micro[m] for m in micro], b


def _nth(b: int) -> str:
    return {2: "2nd", 3: "3rd"}.get(b, f"{b}th")


def loss_divisor(record: list[Any]) -> float | None:
    """The product of the constants a loss record's value was divided by between the loss
    call and the backward's root (the script's ``/ m``, ``accelerator.backward``'s ``/ K``; record layout:
    ``core.window.StepRecord.losses``);
    None when the record has none or multiplies too."""
    consts = record[9] if len(record) > 9 and isinstance(record[9], list) else []
    if not consts or any(not (isinstance(c, list) and len(c) == 2 and c[0] == "/")
                         for c in consts):
        return None
    out = 1.0
    for _, v in consts:
        out *= float(v)
    return out


def units(recs: list[Any]) -> str:
    """What the loss records' counts count, for the words: "tokens" (class-index targets,
    log-prob selections; also a recording without the field), "samples" (probability
    targets), "elements" (``mse_loss`` and its kin); "units" when they differ."""
    kinds = {str(r[10]) if len(r) > 10 and r[10] else "tokens" for r in recs}
    return kinds.pop() if len(kinds) == 1 else "units"


def one(unit: str) -> str:
    """The singular of :func:`units`' word."""
    return unit[:-1] if unit.endswith("s") else unit


def _short(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{Path(path).name}:{line}" if path else site


def loss_weight_findings(rank: int | None, windows: list[StepWindow], world: int = 1
                         ) -> list[Finding]:
    """F5, only when certain: a loss call site present in every micro-step of a window
    gave each micro-step's call the same total weight (``g`` for a mean, ``g·n`` for a
    sum) while their valid counts differed, so one token weighs ``c / n_i``: a
    per-micro-batch mean. Correct normalisations (sum / N, mean · n_i / N, equal counts,
    any constant factor such as a loss scale or Accelerate's division by K) give every
    token one weight; weights that differ in any other pattern (task weights) say
    nothing for certain and stay silent. Beside it, LOSS_SCALE when conservation shows what
    reached the optimizer and each micro-step's mean weighed 1 (not divided by K) or, under
    DDP/FSDP2 over ``world`` ranks, exactly W (times W for the engine's average, not
    divided by K: the transformers Trainer's handling of a loss it expects normalised by
    ``num_items_in_batch``)."""
    out: list[Finding] = []
    for w in windows:
        k = w.window
        if k < 2 or int(w.zero_grads_between):
            # a zero_grad between backwards: not one accumulation window (F3, or a
            # GradScaler that skipped a step and rescaled: two windows seen as one)
            continue
        for site, idx, recs, every in _per_micro_step(w, k):
            k = len(recs)
            ns = [float(r[3]) for r in recs]
            ws = [float(r[4]) for r in recs]
            if not (all(x > 0 for x in ws) or all(x < 0 for x in ws)):
                continue
            ws = [abs(x) for x in ws]
            masses = [x * n for x, n in zip(ws, ns, strict=True)]
            low = any(bool(r[5]) for r in recs)
            tol_w = WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL
            tol_m = MASS_TOL_LOW_PRECISION if low else MASS_TOL
            sw, sm = _spread(ws), _spread(masses)
            if sw <= tol_w or sm > min(tol_m, sw / 10):
                continue
            total = sum(ns)
            red = str(recs[0][6])
            mass = sum(masses) / k
            u = units(recs)
            seen = (f"{_short(site)}: the loss call there (reduction='{red}'"
                    + (f", call {idx + 1} at that line" if idx else "")
                    + (f", in every {_nth(every)} of the window's {w.window} backwards"
                       if every > 1 else "")
                    + f") saw {', '.join(f'{n:g}' for n in ns)} valid {u} in the "
                    f"{k} micro-steps of optimizer step {_n(w.step)}, and each "
                    f"micro-step's {u} reached the optimizer with the same total "
                    f"weight ({mass:.4g}) whatever their count: one {one(u)} weighed "
                    f"{min(ws):.4g} to {max(ws):.4g} ({max(ws) / min(ws):.3g}x apart) "
                    f"instead of one weight for all {total:g} {u} (1/N); ")
            # a mean that was divided by K and times a constant that equals K (a
            # distillation loss's T ** 2 = 4 beside K = 4) totals 1 too: not "undivided"
            undivided = abs(mass - 1.0) <= 1e-3 and not _divided_by(recs, k)
            out.append(_mk("F5", "error", rank, w.step, None,
                           seen + _mean_form(mass, k, undivided),
                           title_=(f"mean of per-micro-batch means, not divided by K "
                                   f"(uneven {one(u)} counts)") if undivided else
                           f"mean of per-micro-batch means / K (uneven {one(u)} counts)"
                           if abs(mass * k - 1.0) <= 1e-3 else
                           f"per-micro-batch means each weighed {mass:.4g} (uneven {one(u)} counts)",
                           fix=None if u == "tokens" else
                           f"Sum the per-{one(u)} losses and divide by the window's total count "
                           "N (all micro-steps, all ranks; all-reduce the count once per "
                           "window) instead of averaging each micro-batch and dividing by K."))
            scale = _received_scale(w, low)
            by_world = (world > 1 and w.engine in ("ddp", "fsdp2") and not undivided
                        and abs(mass - world) <= 1e-3 * world and not _divided_by(recs, k))
            if by_world and scale is not None:
                clip = _clip_words(scale, low)
                out.append(_mk("LOSS_SCALE", "error", rank, w.step, None,
                               f"{_short(site)}: each of the {k} micro-steps of optimizer "
                               f"step {_n(w.step)} backpropagated its loss's {u} with a "
                               f"total weight of {mass:.4g} = W (the world size) and nothing "
                               f"divided it by K = {k}, so the rank's window weighs "
                               f"{k * mass:.4g}; after {w.engine.upper()}'s average over the "
                               f"{world} ranks the update's {u} weigh {k * world} in all "
                               f"instead of 1 (gradient conservation: the optimizer received "
                               f"the window's summed gradient{clip}): {k * world}x the "
                               "large-batch mean (with SGD and no clip, every update is "
                               f"{k * world}x the large batch's), besides the unequal weights "
                               "of the F5 finding beside this one. A transformers Trainer "
                               "does both (times the number of processes, no / K) when it "
                               "expects the model's loss to be normalised by "
                               "num_items_in_batch (a forward taking **kwargs), which this "
                               "loss is not",
                               title_=f"loss {k * world}x too large: each micro-batch's mean "
                                      f"times W = {world}, undivided by K = {k}"))
            if undivided and scale is not None:
                # the same measurement shows the scale: each micro-step's mean whole, K in
                # all; said only where conservation showed what reached the optimizer (an
                # engine's own buffers, DeepSpeed ZeRO, are not read)
                clip = _clip_words(scale, low)
                out.append(_mk("LOSS_SCALE", "error", rank, w.step, None,
                               f"{_short(site)}: each of the {k} micro-steps of optimizer "
                               f"step {_n(w.step)} backpropagated its loss's {u} with a "
                               f"total weight of {mass:.4g}, so the window's weigh "
                               f"{k * mass:.4g} instead of 1, and the optimizer received the "
                               f"window's summed gradient (gradient conservation): {k}x the "
                               f"large-batch mean{clip} (with SGD and no clip, every update "
                               f"is {k}x the large batch's), besides the unequal weights of "
                               "the F5 finding beside this one",
                               title_=f"loss {k}x too large: each micro-batch's mean "
                                      "reached the optimizer undivided by K"))
            break
        if out:
            break
    return out


def _clip_words(scale: float, low: bool) -> str:
    """What the received scale adds to the finding's words: a clip below 1, else nothing."""
    return "" if _near(scale, 1.0, low) else \
        f" before the clip (x{scale:.3g}) that the optimizer's gradient then got"


def _received_scale(w: StepWindow, low: bool) -> float | None:
    """The common scale c with which the optimizer received the window's summed backwards
    (1, or a clip's factor below 1), when conservation was checked on this window; None
    when it was not (not sampled, an engine's buffers) or the fit failed."""
    cons = w.conservation
    if cons is None or not cons.ok or float(cons.received) > (
            WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL):
        return None
    scale = float(cons.scale)
    return scale if 0.0 < scale <= 1.0 + (WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL) else None


def _divided_by(recs: list[list[Any]], k: int) -> bool:
    """Some constant between a record's loss call and its backward's root divides by ``k``
    (``["/", k]``, or ``["*", 1/k]``; the chain of constants the loss record keeps)."""
    for r in recs:
        for d in (r[9] if len(r) > 9 and r[9] else []):
            op, v = str(d[0]), float(d[1])
            if (op == "/" and abs(v - k) <= 1e-6 * k) or (op == "*" and abs(v * k - 1) <= 1e-6):
                return True
    return False


def _mean_form(mass: float, k: int, undivided: bool = True) -> str:
    """How the per-micro-batch mean was scaled, from its total weight per micro-step (a
    GradScaler or an engine's loss scale multiplies it: only 1/K and 1 are named)."""
    if abs(mass * k - 1.0) <= 1e-3:
        return "a per-micro-batch mean divided by K"
    if abs(mass - 1.0) <= 1e-3 and undivided:
        return (f"a per-micro-batch mean not divided by K either, so the window's gradient "
                f"is also {k}x the large-batch mean (a transformers Trainer skips its own /K "
                "when compute_loss is expected to use num_items_in_batch)")
    return f"a per-micro-batch mean scaled by {mass:.4g}"


# -- the scale of the whole window (the loss record's mass; see :mod:`._losses`) -------------

@dataclass(frozen=True)
class _Mass:
    """What a window's recorded loss calls add up to: the total weight of their tokens
    (``mass``: 1 when the window's loss is normalised to the window), whether every
    micro-step had exactly one call that was the whole loss (``sole``), and the site."""

    mass: float
    per_micro: list[float]
    sole: bool
    low: bool
    site: str
    hand: bool = False  # read from the "mean" records of a loss built by hand
    unit: str = "tokens"  # what the loss calls' counts count (:func:`units`)
    terms: bool = False  # read from the constants above a sum of mean terms built by hand

    def words(self, n: int, k: int, *, at: bool = True) -> str:
        """What the window's ``n`` micro-steps weighed and how it was read (``k``: the
        weight ``n/k`` named; ``at``: name the loss's line)."""
        where = self.site.rsplit("/", 1)[-1]
        if not self.hand:
            return (f"its {self.unit} carried a total weight of {self.mass:.4g} = {n}/{k}"
                    + (f" (loss at {where})" if at else ""))
        d = 1 / self.per_micro[0] if len(set(self.per_micro)) == 1 else None
        if self.terms:
            return ("each backward's loss was a sum of terms built by hand, each a mean over "
                    "its micro-batch" + (f" (backward at {where})" if at else "")
                    + (f", the sum multiplied by 1/{d:.4g}" if d is not None else
                       ", the sum multiplied by a constant")
                    + " (read from the autograd graph at run time), so its micro-steps weighed "
                    f"{self.mass:.4g} = {n}/{k} in total")
        return ("each backward's loss was one mean built by hand"
                + (f" (backward at {where})" if at else "")
                + (f" divided by {d:.4g}" if d is not None else " times a constant")
                + " (read from the autograd graph at run time), so its micro-steps weighed "
                f"{self.mass:.4g} = {n}/{k} in total")


def _window_mass(w: StepWindow, *, via_grad: bool = False) -> _Mass | None:
    """The mass of a window whose every micro-step (backward passes, or counted
    ``torch.autograd.grad`` calls with ``via_grad``) has a loss record; None otherwise, and
    when a parameter's tensor hook stood between the loss and ``.grad`` (``grad_hooks``)."""
    recs = [r for r in w.losses or []
            if len(r) > 8 and bool(r[8]) == via_grad]
    if w.grad_hooks:
        return None  # a tensor hook may rescale the gradient after the loss: not the scale
    if not recs or (not via_grad and int(w.zero_grads_between)):
        return None
    n = len({int(r[2]) for r in recs}) if via_grad else int(w.window)
    by_micro: dict[int, list[Any]] = {}
    for r in recs:
        by_micro.setdefault(int(r[2]), []).append(r)
    if n < 1 or sorted(by_micro) != list(range(n)):
        return None
    vals = [float(r[4]) * float(r[3]) for r in recs]
    if not (all(v > 0 for v in vals) or all(v < 0 for v in vals)):
        return None
    per_micro = [sum(abs(float(r[4]) * float(r[3])) for r in by_micro[m]) for m in range(n)]
    sole = all(len(by_micro[m]) == 1 and bool(by_micro[m][0][7]) for m in range(n))
    return _Mass(sum(per_micro), per_micro, sole, any(bool(r[5]) for r in recs),
                 str(recs[0][0]), unit=units(recs))


def _hand_mass(w: StepWindow) -> _Mass | None:
    """The mass of a window whose every micro-step's loss was one mean built by hand times
    constants (its "mean" records, :mod:`._losses_terms`): ``1/divisor`` per micro-step."""
    if w.grad_hooks or int(w.zero_grads_between) or w.backwards_per_micro != 1:
        return None
    by: dict[int, list[Any]] = {}
    for r in w.terms or []:
        if r and r[0] == "mean":
            by.setdefault(int(r[1]), []).append(r)
    n = int(w.window)
    if n < 1 or sorted(by) != list(range(n)) or any(len(v) != 1 for v in by.values()):
        return None
    per = [1.0 / float(by[m][0][2]) for m in range(n)]
    return _Mass(sum(per), per, True, False, str(by[0][0][4]), hand=True)


def _term_mass(w: StepWindow) -> _Mass | None:
    """The mass of a window whose every micro-step's loss was a sum of two or more terms
    built by hand (no loss call recorded with its weights: a log-prob selection weighted
    per sequence is a term), each below a mean over its micro-batch, with
    constants above the sum that every term shares and no factor left unread
    (``(pg + c * kl).mean() / K``): ``per_micro`` is their product. A window's weight is
    then read as for one mean (:func:`_hand_mass`); anything else is not read."""
    if w.grad_hooks or int(w.zero_grads_between) or w.backwards_per_micro != 1 or w.losses:
        return None
    by: dict[int, list[Any]] = {}
    for r in w.terms or []:
        if r and r[0] == "term":
            by.setdefault(int(r[1]), []).append(r)
    n = int(w.window)
    if n < 1 or sorted(by) != list(range(n)):
        return None
    per = []
    for m in range(n):
        rs = by[m]
        if len(rs) < 2 or any(len(r) < 12 or bool(r[6]) or not r[5] for r in rs):
            return None  # one term, a factor not read, a term with no mean above it
        common = list(rs[0][4])
        for r in rs[1:]:
            same = 0
            for a, b in zip(common, r[4], strict=False):
                if str(a[0]) != str(b[0]) or not _is(float(a[1]), float(b[1])):
                    break
                same += 1
            common = common[:same]
        if not common:
            return None
        scale = 1.0
        for op, c in common:
            scale = scale / float(c) if str(op) == "/" else scale * float(c)
        if scale <= 0:
            return None
        per.append(scale)
    return _Mass(sum(per), per, True, False, str(by[0][0][11]), hand=True, terms=True)


def _f7_mass(w: StepWindow) -> _Mass | None:
    """A window's mass for the partial-window rules (F7): from its loss record, else from
    a loss built by hand; None when the optimizer did not receive the window's gradient
    as it was (conservation checked with a boundary scale other than 1: clipping, an
    unscale, a rescale by hand), since the mass is then not what the update weighs."""
    if _rescaled(w):
        return None
    m = _window_mass(w)
    if m is None:
        m = _hand_mass(w)
    return m if m is not None else _term_mass(w)


def sized_on_purpose(long: list[StepWindow], regular: list[StepWindow]) -> str | None:
    """The words for windows of another size than K (``long``, longer or shorter) whose loss
    was normalised to their own size (every one of them and of the windows of K measured
    weighs the same in all): a window size the loop chose (K changed, an accumulation
    schedule), not a counter off; None when that is not shown."""
    ml = [m.mass for w in long if (m := _f7_mass(w)) is not None]
    mr = [m.mass for w in regular if (m := _f7_mass(w)) is not None]
    if len(ml) < len(long) or not mr:
        return None
    ref = mr[0]
    if ref <= 0 or any(abs(x - ref) > 1e-3 * ref for x in ml + mr):
        return None
    return (f"; but each of them, as each window of K, was normalised to its own size (a "
            f"total loss weight of {ref:.4g}): a large batch of {long[0].window}, so if the "
            "window size was meant to change (an accumulation schedule), this is right; if "
            "not, the boundary is off")


def _rescaled(w: StepWindow) -> bool:
    """Conservation was checked and the optimizer received the window's summed gradient
    times a scale other than 1 (a clip that acted, an unscale, a rescale by hand)."""
    cons = w.conservation
    if cons is None or not cons.ok:
        return False
    if float(cons.received) > WEIGHT_TOL:
        # what the optimizer received is no multiple of this rank's own backwards (data
        # parallelism by hand reduced it over the ranks): the fitted scale means nothing;
        # only a clip in the window may have rescaled it
        return bool(int(w.clips))
    return not _near(float(cons.scale), 1.0, False)


def _near(a: float, b: float, low: bool) -> bool:
    return abs(a - b) <= (WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL) * abs(b)


#: Relative tolerance for "this constant is K" (constants are read exactly from the graph).
_EXACT = 1e-9


def _is(c: float, target: float) -> bool:
    return abs(c - target) <= _EXACT * abs(target)


def _divides_by(divs: list[list[Any]], k: int) -> bool:
    """A constant between a loss (or term) and the root divides it by exactly ``k``."""
    return any((str(op) == "/" and _is(float(c), float(k)))
               or (str(op) == "*" and _is(float(c), 1.0 / k)) for op, c in divs)


def grad_step_findings(rank: int | None, windows: list[StepWindow],
                       res: KResolution) -> list[Finding]:
    """F1 for loops that make gradients with ``torch.autograd.grad`` and assign ``.grad``
    by hand (no backward pass is seen): K > 1 declared and every optimizer step came after
    one ``autograd.grad`` of the loss with respect to the parameters. A loop that
    accumulates several such calls before its step is silent, and so is ``autograd.grad``
    for a gradient penalty or a meta-gradient (``create_graph=True``, or inputs that are
    not parameters: not counted by the loss record)."""
    k, script = _firm_k(res), res.script
    if k is None or k <= 1 or any(int(w.window) for w in windows):
        return []  # backward passes seen: the window rules decide
    masses = [m for w in windows for m in [_window_mass(w, via_grad=True)] if m is not None]
    if len(masses) < 2 or any(len(m.per_micro) != 1 for m in masses):
        return []
    m = masses[0]
    scaled = _near(m.mass, 1.0 / k, m.low)
    text = (f"each of the {len(masses)} optimizer steps whose loss was recorded (of "
            f"{len(windows)}) came after a single torch.autograd.grad of the loss with respect to the "
            f"parameters ({_short(m.site)}; no backward pass: .grad assigned by hand), "
            f"while K = {k} ({res.source})")
    if res.strength in ("flag", "runtime") or scaled or (script and script.divides_loss):
        return [_mk("F1", "error", rank, windows[0].step, 0,
                    f"{text}" + (f", and that loss weighed {m.mass:.4g} = 1/K" if scaled
                                 else "") + ": each step applies one micro-batch's "
                    "gradient; sum the K micro-steps' gradients before one step")]
    return [_mk("F1", "note", rank, windows[0].step, 0,
                f"{text}. If it meant to accumulate, the optimizer steps on every "
                "micro-step; pass --accumulation-steps to decide")]


def _firm_k(res: KResolution) -> int | None:
    """K when the run declared it (flag, engine/framework at run time, or the script's
    source), never an inferred one: the F1 rules judge a step per micro-step against it."""
    if res.strength in ("flag", "runtime"):
        return res.k
    return res.script.value if res.script is not None else None
