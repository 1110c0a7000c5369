"""LOSS_SCALE from the scale of a whole window (pure Python): every window of K micro-steps
whose loss is one loss call's output times constants (or a sum of terms under that call's
constants and mean, :mod:`._one_mean`) weighs its tokens K (the loss never divided by K) or
1/K (divided twice) instead of 1, and the optimizer received the backwards' sum unchanged
(gradient conservation, scale 1). :mod:`accumguard.observe.rules` runs it."""

from __future__ import annotations

from accumguard.core.window import StepRecord
from accumguard.observe._one_mean import inside_one_normalisation
from accumguard.observe._records import Finding, StepWindow, _mk, engine_summed, first_per_optimizer
from accumguard.observe._weight_rules import (
    WEIGHT_TOL,
    WEIGHT_TOL_LOW_PRECISION,
    _Mass,
    _near,
    _short,
    _window_mass,
    one,
)

__all__ = ["loss_scale_findings"]


def loss_scale_findings(rank: int | None, windows: list[StepWindow], k: int | None,
                        world: int = 1) -> list[Finding]:
    """The loss divided by K twice: in every window of K micro-steps, each backward's root
    is one loss call's output times constants (nothing else in the loss: a weighted sum of
    several losses is not judged, whatever its weights) and the window's tokens weigh
    1/K in total instead of 1. No correct loop gives that: the optimizer receives G/K.
    On several ranks, 1/K can also be a loss divided by K·W before a hand-written
    all_reduce(SUM) when W = K: then only a note."""
    if k is None or k < 2:
        return []
    if len({w.opt_serial for w in windows}) > 1:
        return first_per_optimizer(windows, lambda w: w.opt_serial,
                                   lambda group: loss_scale_findings(rank, group, k, world))
    if world > 1 and any(w.rank_factor is not None
                         and abs(float(w.rank_factor) * world - 1.0) > 1e-6 for w in windows):
        # the engine's reduction over the ranks is not their average (an FSDP2 divide
        # factor set to K, a summing hook): what one rank's weights say of the update holds
        # only with that factor; the ledger composes it (``ledger_findings``)
        return []
    judged = [(w, m) for w in windows if int(w.window) == k
              for m in [_window_mass(w)] if m is not None
              and (m.sole or inside_one_normalisation(w, m.site, k) is not None)]
    chosen = next(((w, m, f) for w, m in judged if (f := _chosen_factor(w, m))), None)
    if chosen is not None:
        w, m, f = chosen
        return [_mk("LOSS_SCALE", "note", rank, w.step, None,
                    f"{_short(m.site)}: each window of K = {k} micro-steps weighs its {m.unit} "
                    f"{m.mass:.4g} in total, the product of the constants the loss was "
                    f"multiplied by ({f:.4g}; e.g. a distillation temperature squared or a loss "
                    "weight); without them it weighs 1, the large batch's mean. The "
                    "coefficient is the script's choice: not judged",
                    title_="the loss carries a coefficient of the script's own (not judged)",
                    fix="Nothing to fix if the coefficient is intended.")]
    checked = [(w, m) for w, m in judged if w.conservation is not None or engine_summed(w)]
    if checked and all(_near(m.mass, float(k), m.low) for _, m in judged) \
            and all(_unscaled(w, m.low) for w, m in checked):
        # (a window whose gradient was not checked, sampled out or the run's last, weighs
        # its tokens K too; what the optimizer received is read where it was checked)
        return _times_k(rank, judged, k, world)
    if not judged or not all(_near(m.mass, 1.0 / k, m.low) for _, m in judged):
        return []
    w, m = judged[0]
    seen = (f"{_short(m.site)}: {_whole_loss_words(w, m, k)}, and in each window of K = {k} micro-steps "
            f"({len(judged)} judged) its {m.unit} carried a total weight of "
            f"{m.per_micro[0]:.4g} per micro-step (1/K^2 = {1 / k ** 2:.4g}), "
            f"{m.mass:.4g} per window (1/K) instead of 1")
    # an engine that averages the ranks itself (DDP, FSDP2, DeepSpeed) settles it: the
    # per-rank weights of a right loss total 1, so 1/K is K twice whatever W is
    averaging = any(x.engine in _AVERAGING for x, _ in judged)
    if world > 1 and _near(1.0 / k, 1.0 / world, False) and not averaging:
        return [_mk("LOSS_SCALE", "note", rank, w.step, None,
                    f"{seen}. With {world} ranks this is also what a loss divided by K*W "
                    "gives before gradients are summed across ranks by hand "
                    "(all_reduce(SUM), correct); if DDP, FSDP or an engine averages them, "
                    "the loss is divided by K twice and the update is K times too small")]
    return [_mk("LOSS_SCALE", "error", rank, w.step, None,
                f"{seen}: the loss is divided by K twice (e.g. in a model or loss wrapper "
                "and again in the loop, or by hand before accelerator.backward, "
                "engine.backward or a Trainer, which divide by K themselves). The optimizer "
                f"receives G/K: every update is {k}x too small (with SGD, an effective "
                f"learning rate of lr/{k}). Divide by K (or by the window's count) once",
                title_=f"the loss is divided by K twice: the optimizer receives 1/{k} of the "
                       "large batch's gradient")]


def _chosen_factor(w: StepWindow, m: _Mass) -> float | None:
    """Every loss record of the window was multiplied by constants of the script's own
    (``* T * T`` of a distillation temperature, a loss weight) whose product is not 1 and
    without which the window would weigh exactly 1: the weight is the script's choice of
    coefficient, not a missing or doubled division by K, and is not judged. Returns that
    product, else None."""
    prods = set()
    for r in w.losses or []:
        consts = r[9] if len(r) > 9 and isinstance(r[9], list) else []
        prod = 1.0
        for c in consts:
            if isinstance(c, list) and len(c) == 2 and c[0] == "*":
                prod *= float(c[1])
        prods.add(round(prod, 9))
    if len(prods) != 1:
        return None
    prod = prods.pop()
    if prod > 0 and not _near(prod, 1.0, m.low) and _near(m.mass / prod, 1.0, m.low):
        return prod
    return None


def _whole_loss_words(w: StepWindow, m: _Mass, k: int) -> str:
    """How the loss call's weight is the whole loss's: it was the whole loss, or every other
    term sat under its constants and mean (:func:`._one_mean.inside_one_normalisation`)."""
    others = None if m.sole else inside_one_normalisation(w, m.site, k)
    if not others:
        return ("every backward's loss was that call's output times a constant (nothing else "
                "in the loss)")
    return ("every backward's loss was that call's output plus term(s) built from torch ops "
            f"({', '.join(others)}) under the same constants and the same mean, each with a "
            "coefficient of its own only, so the call's weight is the whole loss's")


#: engines that average the gradient over the ranks themselves
_AVERAGING = frozenset({"ddp", "fsdp2", "deepspeed"})


def _unscaled(w: StepRecord, low: bool) -> bool:
    """The optimizer received the sum of the window's backwards as they were (conservation
    checked, common scale c = 1): nothing divided the gradient by hand before the step."""
    if engine_summed(w):
        return True
    cons = w.conservation
    if cons is None or not cons.ok:
        return False
    # ok alone is not enough: with no contribution seen in .grad (gradients moved to a
    # buffer by a post-accumulate hook) the fit is unmatched (received ~ 1) yet not "wiped"
    if float(cons.received) > (WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL):
        return False
    return _near(float(cons.scale), 1.0, low)


def _times_k(rank: int | None, judged: list[tuple[StepWindow, _Mass]], k: int,
             world: int) -> list[Finding]:
    """The loss never divided by K: every window of K weighs its tokens K (each micro-step's
    loss a full mean) and the optimizer receives the sum of the K gradients, K x G."""
    w, m = judged[0]
    clipped = any(int(x.clips) for x, _ in judged)
    ds = all(engine_summed(x) for x, _ in judged)
    seen = (f"{_short(m.site)}: {_whole_loss_words(w, m, k)}, and in each window of K = {k} micro-steps "
            f"({len(judged)} judged) its {m.unit} carried a total weight of "
            f"{m.per_micro[0]:.4g} per micro-step, {m.mass:.4g} per window (K) instead of 1, "
            + ("as the loss reached torch's backward inside DeepSpeed's engine.backward (no "
               "÷GA of the engine's in it: scale_wrt_gas=False), and the engine sums the "
               "window's backwards in its buffers as they are"
               if ds else
               "and the optimizer received that sum unchanged (gradient conservation, scale 1)"))
    if world > 1 and _near(float(k), float(world), False):
        return [_mk("LOSS_SCALE", "note", rank, w.step, None,
                    f"{seen}. With {world} ranks this is also what a loss multiplied by W "
                    "gives to undo DDP's average; if the loss is meant to be the window's "
                    "mean, it is not divided by K and the update is K times too large")]
    return [_mk("LOSS_SCALE", "error", rank, w.step, None,
                f"{seen}: the loss is not divided by K. The optimizer receives K x G, the sum "
                f"of the {k} micro-batch gradients instead of the large batch's mean: with "
                f"SGD every update is {k}x the large-batch step (an effective learning rate "
                f"of {k} x lr); with Adam the difference is nearly hidden (only epsilon"
                + (" and, here, gradient clipping, which sees a norm K times larger"
                   if clipped else " and any gradient clipping") + " change the update), "
                "but it is not the large-batch update. "
                + ("Call engine.backward(loss) without scale_wrt_gas=False (DeepSpeed then "
                   "divides by its gradient_accumulation_steps), or divide the loss by K "
                   "yourself" if ds else
                   f"Divide each micro-step's loss by K (or normalise by the window's "
                   f"{one(m.unit)} count)"),
                title_=f"the loss is not divided by K: the optimizer receives {k}x the "
                       "large batch's gradient",
                fix=("DeepSpeed: call engine.backward(loss) (scale_wrt_gas=True, the default: "
                     "the engine divides by its gradient_accumulation_steps); keep "
                     "scale_wrt_gas=False only for a loss you divided by K yourself" if ds
                     else None))]
