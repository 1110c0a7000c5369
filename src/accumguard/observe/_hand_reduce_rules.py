"""F10 for data parallelism written by hand, from what each rank's optimizer received against
its own backwards and the other ranks' (per-parameter gradient checksums): a reduction that
skips some parameters, one whose result never reaches ``.grad``, and parameters averaged
after each rank's own step instead of gradients before it. :func:`._rank_rules.
cross_rank_findings` asks these before its generic "ranks train different models"
(pure Python, no torch)."""

from __future__ import annotations

from collections.abc import Callable

from accumguard.observe._comm_rules import GRAD_OPS
from accumguard.observe._records import Finding, RunRecording, StepWindow, _mk
from accumguard.observe._weight_rules import WEIGHT_TOL

__all__ = ["parameters_averaged", "reduce_never_reached", "skipped_by_hand_reduce",
           "skipped_finding"]


def skipped_by_hand_reduce(row: dict[int, StepWindow]
                            ) -> tuple[list[int], list[int], float] | None:
    """For one step of data parallelism written by hand (no wrapper, the script reduced
    gradients), seen on every rank with its per-parameter checksums: the parameters whose
    optimizer received exactly this rank's own contributions while the ranks' contributions
    differ (never reduced), and those that received one common c x the sum over ranks
    (reduced), with c; None unless both sets are non-empty and every parameter whose
    ranks' contributions differ is in one of them. A clip after the reduction scales every
    gradient of a rank by that rank's one factor: with clips, the factors are those shared
    by the parameters received as the rank's own (at least two of them, one factor vector
    exactly), and the reduced ones are compared after dividing by them."""
    wins = list(row.values())
    conss = [w.conservation for w in wins]
    if any(w.engine != "local" or not int(w.reductions) for w in wins):
        return None
    sizes = {len(c.contrib_sums) if c is not None else -1 for c in conss} \
        | {len(c.received_sums) if c is not None else -1 for c in conss}
    if len(sizes) != 1 or min(sizes) < 4:
        return None
    contribs = [[float(x) for x in c.contrib_sums] for c in conss if c is not None]
    gots = [[float(x) for x in c.received_sums] for c in conss if c is not None]
    floor = 1e-6 * max(abs(x) for x in (*sum(contribs, []), *sum(gots, [])))

    def close(a: list[float], b: list[float]) -> bool:
        return all(abs(x - y) <= WEIGHT_TOL * max(abs(x), abs(y)) + floor
                   for x, y in zip(a, b, strict=True))

    params = [p for p in range(min(sizes) // 2)
              if not all(close([c[2 * p], c[2 * p + 1]], [contribs[0][2 * p], contribs[0][2 * p + 1]])
                         for c in contribs[1:])]  # agreeing contributions: cannot be told
    scales = [1.0] * len(wins)
    if any(int(w.clips) for w in wins):
        found = _clip_scales(params, contribs, gots, close)
        if found is None:
            return None
        scales = found
    gots = [[x / sc for x in g] for g, sc in zip(gots, scales, strict=True)]
    own: list[int] = []
    reduced: list[int] = []
    for p in params:
        cols = (2 * p, 2 * p + 1)
        mine = [[c[i] for i in cols] for c in contribs]
        got = [[g[i] for i in cols] for g in gots]
        if all(close(got[0], g) for g in got[1:]):
            reduced.append(p)
        elif all(close(g, m) for g, m in zip(got, mine, strict=True)):
            own.append(p)
        else:
            return None  # something else moved this gradient: not judged here
    if not own or not reduced:
        return None
    total = [sum(c[i] for c in contribs) for p in reduced for i in (2 * p, 2 * p + 1)]
    mean_got = [gots[0][i] for p in reduced for i in (2 * p, 2 * p + 1)]
    denom = sum(x * x for x in total)
    if denom <= 0:
        return None
    c = sum(a * b for a, b in zip(mean_got, total, strict=True)) / denom
    if c <= 0 or not close(mean_got, [c * x for x in total]):
        return None
    return own, reduced, c


def _clip_scales(params: list[int], contribs: list[list[float]], gots: list[list[float]],
                 close: Callable[[list[float], list[float]], bool]) -> list[float] | None:
    """Each rank's one clip factor (received / own contribution) shared by the most
    parameters, when at least two share it exactly and it is at most 1 (a clip only
    shrinks); None otherwise."""
    votes: list[list[float]] = []
    for p in params:
        vec = []
        for mine, got in zip(contribs, gots, strict=True):
            i = 2 * p if abs(mine[2 * p]) >= abs(mine[2 * p + 1]) else 2 * p + 1
            if mine[i] == 0:
                break
            t = got[i] / mine[i]
            if not close([got[2 * p], got[2 * p + 1]], [t * mine[2 * p], t * mine[2 * p + 1]]):
                break
            vec.append(t)
        else:
            votes.append(vec)
    best: list[float] | None = None
    count = 0
    for v in votes:
        n = sum(1 for u in votes if close(u, v))
        if n > count:
            best, count = v, n
    if best is None or count < 2 or any(not 0 < x <= 1 + WEIGHT_TOL for x in best):
        return None
    return best


#: optimizers whose update is linear in the gradient history (plain SGD, with momentum or
#: Nesterov): averaging the parameters after each rank's step equals stepping on the average
_LINEAR = ("SGD",)


def parameters_averaged(rec: RunRecording, by_step: dict[int, dict[int, StepWindow]]
                         ) -> list[Finding] | None:
    """Data parallelism by parameter averaging: no wrapper, every collective of every later
    window ran before its first backward (after the previous step: the parameters, not the
    gradients, reduced), and each rank's optimizer received exactly its own gradient. With
    an optimizer linear in the gradient (SGD) that is the large batch's update (an empty
    list: nothing to say); with another one (Adam, AdamW) it is not: F10. None when the run
    is not of that shape."""
    steps = sorted(by_step)
    later = [by_step[s] for s in steps[1:] if len(by_step[s]) >= 2]
    if len(later) < 2 or any(w.engine != "local" for row in later for w in row.values()):
        return None
    raw = {(r, int(x.get("step", -1))): x.get("comm") for r in rec.ranks
           for x in rec.steps.get(r, [])}
    for row in later:
        for r, w in row.items():
            comm = raw.get((r, int(w.step)))
            rows = comm.get("rows") or [] if isinstance(comm, dict) else []
            if not rows or any(not (r and r[0] in GRAD_OPS and int(r[1]) == 0) for r in rows):
                return None
    judged = [row for row in later if all(w.conservation is not None and w.conservation.contrib_sums
                                          for w in row.values())]
    if len(judged) < 2 or not all(reduce_never_reached(row) for row in judged):
        return None
    names = {str(w.optimizer) for row in later for w in row.values()}
    if all(n.startswith(_LINEAR) for n in names):
        return []
    step = steps[1]
    return [_mk("F10", "error", None, step, None,
                f"each rank's optimizer ({', '.join(sorted(names))}) received exactly its own "
                "rank's accumulated gradient in every window (per-parameter checksums), and "
                "the script's collectives all ran before each window's first backward, after "
                "the previous step: the ranks average their parameters after stepping, not "
                "their gradients before. For an optimizer whose update is not linear in the "
                "gradient (Adam's moments) the average of W updates is not the update of the "
                "averaged gradient: the large batch's update is not made",
                title_="parameters averaged after each rank's own step instead of gradients "
                       "before it",
                fix="All-reduce the gradients (sum, then divide by the world size) before "
                    "optimizer.step(), or wrap the model in DDP; averaging the parameters "
                    "afterwards matches only for plain SGD.")]


def reduce_never_reached(row: dict[int, StepWindow]) -> int:
    """For one step of data parallelism written by hand seen on every rank: the number of
    gradient collectives the window issued when, on every rank, the optimizer received
    exactly that rank's own contributions up to one positive scale (a clip's) while the
    ranks' contributions differ; else 0."""
    wins = list(row.values())
    if any(w.engine != "local" or not int(w.reductions) for w in wins):
        return 0
    conss = [w.conservation for w in wins]
    if any(c is None or not c.contrib_sums or len(c.contrib_sums) != len(c.received_sums)
           for c in conss):
        return 0
    contribs = [[float(x) for x in c.contrib_sums] for c in conss if c is not None]
    gots = [[float(x) for x in c.received_sums] for c in conss if c is not None]
    if len({len(c) for c in contribs}) != 1:
        return 0
    for mine, got in zip(contribs, gots, strict=True):
        denom = sum(x * x for x in mine)
        if denom <= 0:
            return 0
        sc = sum(a * b for a, b in zip(got, mine, strict=True)) / denom
        resid = sum(abs(a - sc * b) for a, b in zip(got, mine, strict=True))
        if sc <= 0 or resid > WEIGHT_TOL * max(sum(abs(a) for a in got), 1e-30):
            return 0
    scale = max(abs(x) for c in contribs for x in c) or 1e-30
    apart = max(abs(a - b) for a, b in zip(contribs[0], contribs[1], strict=True)) / scale
    return int(wins[0].reductions) if apart > 1e-4 else 0


def skipped_finding(rec: RunRecording, step: int, evidence: str, own: list[int],
                     reduced: list[int], c: float) -> Finding:
    """F10 for the parameters a hand-written all-reduce never covered."""
    names = next((e.get("tracked") for e in rec.end.values()
                  if isinstance(e.get("tracked"), list)), None)
    picked = [names[p] if names and p < len(names) and names[p] else f"#{p + 1}"
              for p in own]
    shown = ", ".join(picked[:8]) + (f" and {len(picked) - 8} more" if len(picked) > 8 else "")
    where = "" if names else " (numbered in the model's named_parameters() order)"
    return _mk("F10", "error", None, step, None,
               evidence + f"; for {len(own)} of the {len(own) + len(reduced)} parameters "
               f"whose ranks' gradients differ, each rank's optimizer received exactly its own "
               f"rank's accumulated gradient (per-parameter checksums), while the other "
               f"{len(reduced)} received {c:.4g} x the sum over ranks: the script's own "
               f"all-reduce never covered {shown}{where}",
               title_=f"{len(own)} parameters are never averaged over the ranks: the "
                      "hand-written all-reduce skips them",
               fix="All-reduce the gradient of every parameter the optimizer steps (iterate "
                   "over all of its param_groups, or over model.parameters()), with the same "
                   "division by the world size as the others, before the optimizer step.")
