"""Per-step figures of the accumulation checks, in the shape the trainers' loggers take.

The callbacks hand these to the framework's own logging (the HF ``Trainer``'s ``logs`` dict,
which every ``report_to`` integration receives; Lightning's ``LightningModule.log``), so the
numbers sit next to the loss in TensorBoard, W&B, MLflow... Every key starts with
``accumguard/``. The figures are those of the last *checked* optimizer step (one in
``every_n_steps``); a step that was not checked logs nothing new:

``accumguard/backwards``            backward passes in the window (K when right);
``accumguard/grad_collectives``     gradient collectives the window issued, as ``accumguard
                                    watch`` counts them (DDP/FSDP2, DeepSpeed's comm);
``accumguard/conservation_error``   relative difference between what the optimizer received
                                    and the sum of the micro-steps' gradients (up to one
                                    common scale, which clipping applies; ~1e-7 when right);
``accumguard/token_weight_error``   ``max |w·N - 1|`` over the window's micro-steps, w being
                                    the weight one valid token finally carried in the
                                    gradient and N the window's valid tokens over all ranks:
                                    0 (to rounding) for the exact large-batch token mean,
                                    ``max |N/(K·n_i) - 1|``-sized under F5;
``accumguard/findings``             findings so far (all classes);
``accumguard/finding``              (text, HF only) the new findings, one per line.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PREFIX", "event_figures", "token_weight_error"]

PREFIX = "accumguard/"


def event_figures(event: Any) -> dict[str, float]:
    """The figures of one observed optimizer step (an ``observe.StepEvent``)."""
    out = {"backwards": float(event.backwards)}
    if event.reductions:
        out["grad_collectives"] = float(event.reductions)
    cons = event.conservation
    if cons is not None:
        out["conservation_error"] = float(cons.received)
    return out


def token_weight_error(ranks: list[list[list[float]]], *, world_size: int,
                       averages_over_ranks: bool) -> float | None:
    """``max |w·N - 1|`` of one window from the probe's records (``ranks[r]``: rank r's
    ``[n_i, Σ s·(1−p_y), Σ (1−p_y)]`` per micro-step, as
    :func:`accumguard.observe.rules.classify_token_weights` reads them); None when no
    micro-step had a valid token."""
    rows = [(float(n), float(num), float(den)) for recs in ranks for n, num, den in recs]
    rows = [r for r in rows if r[0] > 0 and r[2] > 0]
    if not rows:
        return None
    total = sum(r[0] for r in rows)
    avg = 1.0 / world_size if averages_over_ranks else 1.0
    return max(abs(num / den * avg * total - 1.0) for _, num, den in rows)
