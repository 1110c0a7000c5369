"""The factor a DDP communication hook of the script's applied to the sum over the ranks of
their gradients, measured (pure Python): the observer read the sum of every bucket the hook
was handed (this rank's own gradient, before any reduction; ``StepRecord.hook_in``) and the
gradient checksum the optimizer received. Both are linear, so on every rank
``received = c x (sum over ranks of the buckets)``: c = 1/W for an averaging hook (DDP's
own reduction), 1 for a hook that sums. The loss-weight ledger (:mod:`._ledger`) composes
the engine's factor with the ranks' loss weights; for a hook it could not read one
(:func:`._reduction.rank_factor` gives None), and :func:`fill_hook_factors` supplies the
measured one, exactly 1/W or 1, where every rank agrees."""

from __future__ import annotations

from typing import Any

from accumguard.observe._records import Finding, RunRecording, _mk, _windows, lines_by_step
from accumguard.observe._weight_rules import WEIGHT_TOL, _window_mass

__all__ = ["fill_hook_factors", "hook_factor", "hook_k_findings", "hook_sum_findings",
           "measured_factor"]

#: the signed sum the optimizer received, relative to its absolute sum, below which the fit
#: is not trusted (the ranks' signed sums cancel: fp32 rounding of the reduction dominates)
_MIN_SIGNED = 1e-3
#: relative agreement of the fitted factor with 1/W or 1
_TOL = 1e-3


def hook_factor(rows: list[dict[str, Any]], world: int) -> float | None:
    """The hook's factor for one optimizer step seen on every rank (``rows``: the ranks'
    step lines), 1/W or 1, or None when it cannot be read: a rank without a hook call in
    the window's last backward only, a signed sum too small to divide by, ranks that
    disagree, or a factor that is neither."""
    c = measured_factor(rows, world)
    if c is None:
        return None
    for target in (1.0 / world, 1.0):
        if abs(c - target) <= _TOL * target:
            return target
    return None


def measured_factor(rows: list[dict[str, Any]], world: int) -> float | None:
    """The one factor c, common to every rank within :data:`_TOL`, with which every rank's
    optimizer received the sum over the ranks of the buckets its hook was handed; None when
    it cannot be read (see :func:`hook_factor`)."""
    if world < 2 or len(rows) != world:
        return None
    total = 0.0
    for r in rows:
        calls = r.get("hook_in")
        n = int(r.get("backwards") or 0)
        if r.get("engine") != "ddp" or not calls or n < 1 or not r.get("checksum") \
                or any(int(b) != n - 1 for b, _ in calls):
            return None  # (a bucket reduced before the window's last backward: not fitted)
        total += sum(float(x) for _, x in calls)
    if total == 0.0:
        return None
    cs = []
    for r in rows:
        got, mass = float(r["checksum"][0]), float(r["checksum"][2])
        if abs(got) < _MIN_SIGNED * mass:
            return None
        cs.append(got / total)
    if cs[0] <= 0 or max(cs) - min(cs) > _TOL * max(cs):
        return None
    return sum(cs) / len(cs)


def fill_hook_factors(rec: RunRecording) -> int:
    """Give each step line of a DDP run whose reduction was a hook of the script's (no
    ``rank_factor`` read) the factor :func:`hook_factor` measured; how many steps got one."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    by_step: dict[int, dict[int, dict[str, Any]]] = lines_by_step(
        rec, lambda line: line if line.get("hook_in") else None)
    filled = 0
    for rows in by_step.values():
        if any(line.get("rank_factor") is not None for line in rows.values()):
            continue
        c = hook_factor([rows[r] for r in ranks if r in rows], rec.world)
        if c is None:
            continue
        for line in rows.values():
            line["rank_factor"] = c
            line["rank_factor_measured"] = "comm_hook"
        filled += 1
    return filled


def hook_sum_findings(rec: RunRecording) -> list[Finding]:
    """F10 for a DDP communication hook that sums the ranks' gradients (measured factor 1,
    :func:`fill_hook_factors`) while every rank's loss is its own mean (each backward one
    loss call times constants, its window's tokens weighing 1 on every rank): the update is
    the sum over the W ranks of their large-batch means, W times the large batch's. A loss
    normalised over the ranks' global count weighs n_r / N on each rank and is right with
    a summing hook: not this rule's (the ledger judges it)."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    world = len(ranks)
    if world < 2 or world != rec.world:
        return []
    per_rank = {r: {w.step: w for w in _windows(rec.steps[r])} for r in ranks}
    judged: list[int] = []
    for step in sorted(per_rank[ranks[0]]):
        rows = [per_rank[r].get(step) for r in ranks]
        if any(w is None or w.engine != "ddp" or w.rank_factor != 1.0 for w in rows):
            continue
        masses = [_window_mass(w) for w in rows if w is not None]
        if len(masses) == world and all(m is not None and m.sole and abs(m.mass - 1.0) <= WEIGHT_TOL
                                        for m in masses):
            judged.append(int(step))
    if not judged or len(judged) * 2 < len(per_rank[ranks[0]]):
        return []
    return [_mk("F10", "error", None, judged[0], None,
                f"the DDP communication hook registered by the script summed the ranks' "
                f"gradients without dividing by the world size: on every rank the optimizer "
                f"received exactly 1 x the sum over the {world} ranks of the buckets the hook "
                f"was handed (measured: bucket sums before the hook, gradient checksums at the "
                f"step), while each rank's loss was its own mean (its window's tokens weigh 1 "
                f"on each rank), so every update is the sum of {world} large-batch means, "
                f"{world}x too large ({len(judged)} step(s))",
                title_=f"a DDP communication hook sums the gradients over the ranks without "
                       f"dividing by W: every update is {world}x too large",
                fix="Divide the bucket by the process group's size in the hook "
                    "(bucket.buffer().div_(dist.get_world_size()) before the all_reduce, or "
                    "the result in its then() callback), or register torch's "
                    "default_hooks.allreduce_hook. A summing hook is right only for a loss "
                    "divided by the token count of all ranks together.")]


def hook_k_findings(rec: RunRecording) -> list[Finding]:
    """LOSS_SCALE for a DDP communication hook that divides the ranks' sum by W x K (measured
    factor 1/(W K), K the window's backward passes) while each rank's loss is already
    normalised to its window (its window's tokens weigh 1 on each rank: divided by K, or by
    the window's count): the accumulation's division happens twice, every update is K times
    too small."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    world = len(ranks)
    if world < 2 or world != rec.world:
        return []
    lines: dict[int, dict[int, dict[str, Any]]] = {}
    for r in ranks:
        for line in rec.steps[r]:
            if line.get("kind", "step") == "step" and line.get("hook_in"):
                lines.setdefault(int(line["step"]), {})[r] = line
    per_rank = {r: {w.step: w for w in _windows(rec.steps[r])} for r in ranks}
    judged: list[tuple[int, int, float]] = []
    for step in sorted(per_rank[ranks[0]]):
        rows = [per_rank[r].get(step) for r in ranks]
        got = lines.get(int(step), {})
        if any(w is None or w.engine != "ddp" for w in rows) or len(got) != world:
            continue
        k = int(rows[0].backwards or 0) if rows[0] is not None else 0
        c = measured_factor([got[r] for r in ranks], world)
        if k < 2 or c is None or abs(c * world * k - 1.0) > _TOL:
            continue
        masses = [_window_mass(w) for w in rows if w is not None]
        if len(masses) == world and all(m is not None and m.sole
                                        and abs(m.mass - 1.0) <= WEIGHT_TOL for m in masses):
            judged.append((int(step), k, c))
    if not judged or len(judged) * 2 < len(per_rank[ranks[0]]):
        return []
    step, k, c = judged[0]
    return [_mk("LOSS_SCALE", "error", None, step, None,
                f"the DDP communication hook registered by the script divided the sum over the "
                f"{world} ranks by {world * k} = W x K: on every rank the optimizer received "
                f"{c:.4g} x the sum of the buckets the hook was handed (measured: bucket sums "
                f"before the hook, gradient checksums at the step), while each rank's loss was "
                f"already normalised to its window of K = {k} micro-steps (its window's tokens "
                f"weigh 1 on each rank), so every update is {k}x too small ({len(judged)} "
                "step(s))",
                title_=f"a DDP communication hook divides by W x K while the loss is already "
                       f"divided by K: every update is {k}x too small",
                fix="Divide the bucket by the world size only in the hook (or register torch's "
                    "default_hooks.allreduce_hook): the loss's own division by K (or by the "
                    "window's count) already makes the window's mean.")]
