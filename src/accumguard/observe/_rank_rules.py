"""F10, averaging over ranks missing or doubled, from what the optimizer received: on DDP
from one rank's conservation scale (a hand-written all-reduce after DDP's synced backward),
without DDP from every rank's gradient checksums together (data parallelism written by
hand); and F11 when the gradient the optimizer received differs across ranks on an engine
that replicates it (the ranks' checksums). :mod:`accumguard.observe.rules` runs them and
re-exports the first two (pure Python, no torch)."""

from __future__ import annotations

from accumguard.observe._comm_rules import GRAD_OPS
from accumguard.observe._hand_reduce_rules import (
    parameters_averaged,
    reduce_never_reached,
    skipped_by_hand_reduce,
    skipped_finding,
)
from accumguard.observe._ledger_source import reads_without_world_division
from accumguard.observe._loose_findings import (
    ddp_loose_finding,
    ds_loose_finding,
    loose_grads_differ,
    outside_units,
    spread,
)
from accumguard.observe._records import Finding, RunRecording, StepWindow, _mk, _n, _windows
from accumguard.observe._weight_rules import (
    WEIGHT_TOL,
    WEIGHT_TOL_LOW_PRECISION,
    _hand_mass,
    _Mass,
    _near,
    _window_mass,
)

__all__ = ["averaged_inside_steps", "clipped_apart_findings", "received_alike_steps", "cross_rank_findings", "joined_rank_findings",
           "manual_reduce_findings", "rank_scale_findings"]


def rank_scale_findings(rank: int | None, windows: list[StepWindow], world: int
                        ) -> list[Finding]:
    """F10 from what the step received: on DDP, whose synced last backward already averaged
    the gradient across ranks, the loop issued gradient collectives of its own (DDP's own
    reductions run in C++ and are not counted, so every counted one is the script's), and
    the optimizer received exactly c times the sum of the backwards (conservation checked,
    its residual within tolerance, no clipping in the window). c = W: a hand-written
    all_reduce(SUM) without /W; c = 1/W: averaged twice; c = 1: a redundant all-reduce
    (correct, a note). Anything else is not judged."""
    if world < 2:
        return []
    hits: list[tuple[StepWindow, float]] = []
    redundant: list[StepWindow] = []
    for w in windows:
        cons = w.conservation
        syncs = w.sync_micros or []
        if (w.engine != "ddp" or not syncs or syncs[-1] is not True
                or int(w.reductions) < 1 or int(w.clips)
                or cons is None or not cons.ok
                or float(cons.received) > WEIGHT_TOL):
            continue
        c = float(cons.scale)
        if _near(c, float(world), False) or _near(c, 1.0 / world, False):
            hits.append((w, c))
        elif _near(c, 1.0, False) and int(w.reductions) >= int(cons.params):
            # (a note only for one collective per gradient tensor or more: a count or a
            # metric all-reduced before the first backward is not a gradient collective)
            redundant.append(w)
    if hits and len(hits) * 2 >= len(windows):
        w, c = hits[0]
        many = c > 1
        return [_mk("F10", "error", rank, w.step, None,
                    f"DDP averaged the gradient across the {world} ranks in the window's last "
                    f"(synced) backward, then the script issued {int(w.reductions)} "
                    "gradient collective(s) of its own before the optimizer step, and the "
                    f"optimizer received {c:.4g} x the gradient the backwards produced "
                    f"(gradient conservation, {len(hits)} of {len(windows)} step(s)): "
                    + (f"an all_reduce(SUM) without /W, every update is {world}x too large"
                       if many else f"the gradient averaged twice, every update is "
                       f"{world}x too small")
                    + ". Remove the hand-written all-reduce (DDP already averages), or "
                    "average it exactly once")]
    if redundant:
        w = redundant[0]
        extra = int(w.reductions)
        return [_mk("EXTRA_SYNC", "note", rank, w.step, None,
                    f"DDP averaged the gradient in the synced backward and the script issued "
                    f"{extra} more gradient collective(s) per optimizer step that left it "
                    f"unchanged ({len(redundant)} step(s)): they cost communication only",
                    title_=f"gradient all-reduced again after DDP's: {extra} extra "
                           "collective(s) per optimizer step",
                    fix="Drop the hand-written all-reduce: DDP already averages the gradient "
                        "across ranks.")]
    return []


def manual_reduce_findings(rec: RunRecording) -> list[Finding]:
    """F10 for a hand-written data parallelism (no DDP/FSDP/engine: the script all-reduces
    .grad itself). The checksums are linear, so on every rank what the optimizer received
    is c x the sum over ranks of the ranks' accumulated gradients: c = 1 for all_reduce(SUM),
    1/W for AVG (fitted offline, every rank's residual within tolerance, same c on all).
    Whether SUM is a bug depends on the loss: the update is c x (the loss records' total
    mass over ranks) x the large-batch gradient. Each rank normalised to its own batch
    (mass 1, e.g. mean / K): W with SUM (never divided by W, an error), 1 with AVG; a
    loss already divided by W (or by the global count): 1 with SUM, 1/W with AVG (an
    error: divided by W twice).
    Judged only where every micro-step's backward is one loss call (the mass is read, not
    guessed), nothing clipped the window, and every rank received something its own
    backwards do not account for (the collective ran after them: a reduction inside each
    backward, by a tensor hook, is not judged, its op is not recorded)."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    world = len(ranks)
    if world < 2 or world != rec.world:
        return []
    per_rank = {r: {w.step: w for w in _windows(rec.steps[r])} for r in ranks}
    judged: list[tuple[int, float]] = []
    for step in sorted(per_rank[ranks[0]]):
        rows = [per_rank[r].get(step) for r in ranks]
        fit = _reduce_fit(rows)
        if fit is not None:
            judged.append((step, fit))
    hits = [(st, e) for st, e in judged if _near(e, float(world), True) or
            _near(e, 1.0 / world, True)]
    if not hits or len(hits) * 2 < len(judged):
        return _short_scaled_as_full(per_rank, ranks, judged)
    step, eff = hits[0]
    many = eff > 1
    return [_mk("F10", "error", None, step, None,
                f"the script all-reduced the gradients itself (no DDP, FSDP or engine), and "
                f"the optimizer received {eff:.4g} x the large-batch gradient of the "
                f"{world} ranks (gradient checksums of every rank: "
                + ("the sum over ranks of gradients each normalised to its own batch: an "
                   f"all_reduce(SUM) never divided by W, every update is {world}x too large"
                   if many else f"averaged over ranks after a loss already divided by W, "
                   f"every update is {world}x too small")
                + f"; {len(hits)} of {len(judged)} checked step(s)). "
                + ("Divide the summed gradients by the world size (or use ReduceOp.AVG)"
                   if many else "Divide by the world size once"))]


def _short_scaled_as_full(per_rank: dict[int, dict[int, StepWindow]], ranks: list[int],
                          judged: list[tuple[int, float]]) -> list[Finding]:
    """F7 on data parallelism by hand, from what the optimizer received: every full window
    (K backwards on every rank) carried the large batch's gradient (c x W x mass = 1), and
    a window shorter than K carried a fraction of it: its reduced gradient was divided by
    a full window's size (or K) instead of what the short window held. Only windows whose
    fit holds on every rank are read; a short window normalised by its own count weighs 1."""
    lengths = {st: [int(per_rank[r][st].window) for r in ranks] for st, _ in judged}
    k = max((max(n) for n in lengths.values()), default=0)
    full = [e for st, e in judged if min(lengths[st]) == k]
    if k < 2 or len(full) < 2 or not all(_near(e, 1.0, True) for e in full):
        return []
    for st, e in judged:
        n = max(lengths[st])
        if n >= k or _near(e, 1.0, True):
            continue
        first = per_rank[ranks[0]]
        nxt = first.get(st + 1)
        where = (" (the end of a pass over the DataLoader)"
                 if nxt is not None and 0 in (nxt.data_pass_starts or [])
                 else " (the end of the run)" if nxt is None else "")
        return [_mk("F7", "error", None, st, n - 1,
                    f"the script all-reduced the gradients itself (no DDP, FSDP or engine); "
                    f"the window before optimizer step {_n(st)} had {n} of K = {k} "
                    f"micro-steps{where}, and the optimizer received {e:.4g} x that window's "
                    f"large-batch gradient (gradient checksums of every rank, against the "
                    f"loss records), while each of the {len(full)} full window(s) checked "
                    "received exactly its large-batch gradient: the short window's reduced "
                    "gradient was divided by a full window's size, not by what it held",
                    title_=f"a short window ({n} of K = {k} micro-steps) scaled as a full one: "
                           f"its update is {e:.3g} x its large-batch gradient",
                    fix="Divide the short window's summed gradient by the samples (or "
                        "tokens) it really held across the ranks (an all-reduced count), "
                        "not by the nominal micro_batch x K x world size.")]
    return []


def _terms_of_one_mean(mass: _Mass, w: StepWindow) -> bool:
    """Several loss calls per micro-step whose weights add up to one micro-batch mean per
    window on this rank (a symmetric InfoNCE ``0.5 * (ce(l, y) + ce(l.T, y)) / K``), in a file
    that divides no loss by the world size: normalised to the rank's own batch, as one mean
    call would be (a sum of terms already divided by W is told apart by its source)."""
    tol = WEIGHT_TOL_LOW_PRECISION if mass.low else WEIGHT_TOL
    path = mass.site.rpartition(":")[0]
    return abs(mass.mass - 1.0) <= tol and bool(path) and reads_without_world_division(path)


def _reduce_fit(rows: list[StepWindow | None]) -> float | None:
    """c x W x mass for one step seen on every rank (see :func:`manual_reduce_findings`),
    or None when the step cannot be judged."""
    contribs, gots, masses = [], [], []
    low = False
    for w in rows:
        if w is None or w.engine != "local" or not int(w.reductions) \
                or int(w.clips):
            return None
        cons = w.conservation
        if cons is None or not cons.contrib_sums \
                or len(cons.contrib_sums) != len(cons.received_sums or ()):
            return None
        if not cons.ok and cons.reason != "wiped":
            return None  # (a window reduced between its backwards is judged if the fit holds)
        if float(cons.received) <= WEIGHT_TOL:
            # the rank's backwards alone account for what it received: any reduction ran
            # inside the backwards (a tensor hook), so contrib already holds every rank's
            # gradient and the fit below would read c = 1/W; not judged
            return None
        # a loss call's records, or a mean built by hand (`-logsigmoid(x).mean() / K`: its
        # "mean" records)
        mass = _window_mass(w) or _hand_mass(w)
        if mass is None or not (mass.sole or _terms_of_one_mean(mass, w)):
            return None
        low = low or mass.low
        contribs.append([float(x) for x in cons.contrib_sums])
        gots.append([float(x) for x in cons.received_sums])
        masses.append(mass.mass)
    cs = _common_fit(contribs, gots, WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL)
    if cs is None:
        return None
    # every token's weight summed over all ranks: 1 for the large batch (ranks normalised
    # to their own batch have mass 1 each, to the global count n_r / N)
    return float(sum(cs) / len(cs) * sum(masses))


def _common_fit(contribs: list[list[float]], gots: list[list[float]], tol: float
                ) -> list[float] | None:
    """Each rank's c in ``got_r = c x (sum over ranks of contrib)``, one c for every rank
    (linear checksums), or None when some rank's residual or the spread of c exceeds ``tol``
    (relative)."""
    if not contribs or len({len(c) for c in contribs + gots}) != 1:
        return None
    total = [sum(col) for col in zip(*contribs, strict=True)]
    denom = sum(x * x for x in total)
    if denom <= 0:
        return None
    cs = []
    for got in gots:
        c = sum(a * b for a, b in zip(got, total, strict=True)) / denom
        resid = sum(abs(a - c * b) for a, b in zip(got, total, strict=True))
        if c <= 0 or resid > tol * max(sum(abs(a) for a in got), 1e-30):
            return None  # not c x the ranks' sum: something else moved the gradient
        cs.append(c)
    if max(cs) - min(cs) > tol * max(cs):
        return None
    return cs


def averaged_inside_steps(rec: RunRecording) -> set[int]:
    """Optimizer steps of a hand-written data parallelism whose accumulated ``.grad`` changed
    between backward passes (the script reduced it inside the window), yet on every rank the
    optimizer received one common multiple of the sum over ranks of all the window's
    contributions: an average (all_reduce SUM then /W) after every micro-batch is idempotent
    on the part already averaged, so the window still sums every micro-batch of every rank
    once. Such a window's reduction is not F10 (its scale is judged by
    :func:`manual_reduce_findings`); a SUM without /W after every micro-batch counts the
    earlier micro-batches W times and fails the fit."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2 or len(ranks) != rec.world:
        return set()
    out: set[int] = set()
    for step, row in _by_step(rec).items():
        rows = [row.get(r) for r in ranks]
        # (DDP too: a window whose gradients a callback stashed between the backwards, reduced
        # by hand and put back before the step, beside the last micro-step's DDP average)
        conss = [None if w is None or w.engine not in ("local", "ddp") else w.conservation
                 for w in rows]
        if any(c is None or c.reason != "wiped" or not c.contrib_sums for c in conss):
            continue
        contribs = [[float(x) for x in c.contrib_sums] for c in conss if c is not None]
        gots = [[float(x) for x in c.received_sums] for c in conss if c is not None]
        if _common_fit(contribs, gots, WEIGHT_TOL) is not None:
            out.add(int(step))
    return out


def received_alike_steps(rec: RunRecording) -> set[int]:
    """Optimizer steps (1-based, as findings number them) at which every rank of a DDP run
    recorded what its optimizer received and all agree: whatever the sync flags read at the
    forwards (Accelerate's ``trigger_sync_in_backward`` forces a reduction after a forward
    under ``no_sync``), the ranks' gradients were combined, or were the same."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2 or len(ranks) != rec.world:
        return set()
    out: set[int] = set()
    for step, row in _by_step(rec).items():
        if len(row) != len(ranks) or any(s.engine != "ddp" or not s.checksum
                                         for s in row.values()):
            continue
        if spread([list(s.checksum or ()) for s in row.values()]) <= 1e-5:
            out.add(int(step) + 1)
    return out


def cross_rank_findings(rec: RunRecording) -> list[Finding]:
    """What reached the optimizer must agree across ranks on replicated-gradient engines."""
    by_step = _by_step(rec)
    averaged = parameters_averaged(rec, by_step)
    if averaged is not None:
        return averaged
    for step in sorted(by_step):
        row = by_step[step]
        loose_ddp = loose_grads_differ(step, row)
        if loose_ddp is not None:
            return [loose_ddp]
        if len(row) >= 2 and all(s.engine == "fsdp2" for s in row.values()):
            outside = outside_units(step, row)
            if outside is not None:
                return [outside]
            alone = _fsdp2_alone(rec, step, row)
            if alone is not None:
                return [alone]
        if len(row) < 2 or any(s.engine == "fsdp2" for s in row.values()):
            continue
        if any(s.pre_hooked for s in row.values()):
            continue  # the optimizer's own step pre-hooks ran after the read (a hand
            # all-reduce there makes the gradients agree only after the checksum)
        sums: dict[int, list[float]] = {r: s.checksum for r, s in row.items()
                                        if s.checksum}
        if len(sums) < 2:
            continue
        if spread(list(sums.values())) > 1e-5:
            text = ", ".join(f"rank {r}: {v[0]:.6g}" for r, v in sorted(sums.items()))
            evidence = (f"the gradient the optimizer received differs across ranks at step "
                        f"{_n(step)} (checksums {text}): ranks train different models")
            ranks = [r for r in rec.ranks if rec.steps.get(r)]
            never = _never_synchronised(rec, ranks)
            if never is not None:
                return [_never_finding(step, evidence, never)]
            loose = next((s.unwrapped for s in row.values() if s.unwrapped), None)
            if loose and any(s.engine == "deepspeed" for s in row.values()):
                return [ds_loose_finding(step, evidence, loose)]
            if loose:
                return [ddp_loose_finding(step, evidence, loose)]
            skipped = skipped_by_hand_reduce(row)
            if skipped is not None:
                return [skipped_finding(rec, step, evidence, *skipped)]
            lost = reduce_never_reached(row)
            if lost:
                return [_mk("F10", "error", None, step, None,
                            evidence + f"; the script issued {lost} collective(s) in "
                            "the window, yet what each rank's optimizer received is exactly "
                            "its own rank's accumulated gradient (per-parameter checksums, up "
                            "to one scale per rank such as a clip's): the reduced values never "
                            "reached the .grad the optimizer steps",
                            title_="the hand-written all-reduce never reaches the gradients "
                                   "the optimizer steps: each rank steps its own",
                            fix="Reduce the .grad tensors themselves (dist.all_reduce(p.grad)) "
                                "or copy the reduced buffer back into every .grad; iterate "
                                "over a list, not a generator already consumed by the "
                                "gathering loop, and do not reduce a copy "
                                "(p.grad.clone(), torch.cat) without writing it back.")]
            return [_mk("F11", "error", None, step, None, evidence,
                        title_="the ranks' optimizers received different gradients: ranks "
                               "train different models",
                        fix="Find what the ranks did not reduce alike: a micro-step whose "
                            "sync flag was off at its backward (no_sync / "
                            "require_backward_grad_sync spanning the wrong micro-steps), "
                            "parameters a hand-written all-reduce skips (some parameter "
                            "groups, a module outside the wrapper), or a gradient changed "
                            "on one rank after the reduction.")]
    return []


def joined_rank_findings(rec: RunRecording) -> list[Finding]:
    """F6 for DDP under ``Join`` with ``divide_by_initial_world_size`` True: optimizer steps
    that only some ranks took (the others had run out of data and ended their recordings
    earlier) still divided the summed gradient by the launch's world size, so each such
    step is n/W of its contributing ranks' mean."""
    by_step = _by_step(rec)
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2:
        return []
    last = {r: max(s.step for s in _windows(rec.steps[r])) for r in ranks}
    partial = []
    for step in sorted(by_step):
        row = by_step[step]
        gone = [r for r in ranks if r not in row]
        if not gone or any(last[r] >= step for r in gone):
            continue
        if all(w.engine == "ddp" and w.join_initial is True for w in row.values()):
            partial.append((step, sorted(row), gone))
    if not partial:
        return []
    step, present, gone = partial[0]
    w = len(ranks)
    return [_mk("F6", "error", None, step, None,
                f"{len(partial)} optimizer step(s) ran on rank(s) {present} only, from step "
                f"{_n(step)} on (rank(s) {gone} had run out of data and joined: DDP's "
                f"`Join`), and DDP divided the summed gradient by the launch's world size "
                f"{w} (divide_by_initial_world_size=True): each such update is "
                f"{len(present)}/{w} of the mean gradient of the ranks that trained, where "
                "the large batch of that step (their micro-batches) weighs them 1",
                title_="uneven inputs under Join: steps of the remaining ranks divided by "
                       "the full world size",
                fix="Join([ddp_model], divide_by_initial_world_size=False) (or "
                    "ddp_model.join(divide_by_initial_world_size=False)): the gradient is then "
                    "divided by the ranks still training; or give every rank the same number "
                    "of batches (DistributedSampler with drop_last=True)")]


def _by_step(rec: RunRecording) -> dict[int, dict[int, StepWindow]]:
    """Per optimizer step, each rank's window of it (empty with fewer than two ranks)."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2:
        return {}
    by_step: dict[int, dict[int, StepWindow]] = {}
    for r in ranks:
        for s in _windows(rec.steps[r]):
            by_step.setdefault(s.step, {})[r] = s
    return by_step


def _fsdp2_alone(rec: RunRecording, step: int, row: dict[int, StepWindow]) -> Finding | None:
    """F10: every rank's FSDP2 units sit on a mesh of one rank (``fully_shard`` given a
    sub-mesh of size 1, e.g. the shard dimension of a (W, 1) mesh): each unit's
    reduce-scatter is over that rank alone, so with a mesh of one rank each rank's local
    gradient is its whole gradient, and these differ across the ranks while no collective
    reduced a gradient in any recorded step."""
    if rec.world < 2 or any(s.fsdp_mesh != 1 for s in row.values()):
        return None
    sums = {r: s.checksum for r, s in row.items() if s.checksum}
    if len(sums) < 2 or spread(list(sums.values())) <= 1e-5:
        return None
    for r in rec.ranks:
        for line in rec.steps.get(r, []):
            comm = line.get("comm")
            rows = comm.get("rows", []) if isinstance(comm, dict) else []
            if any(x and x[0] in GRAD_OPS for x in rows):
                return None  # something reduced a gradient (the script's own all-reduce)
    text = ", ".join(f"rank {r}: {v[0]:.6g}" for r, v in sorted(sums.items()))
    return _mk("F10", "error", None, step, None,
               f"every FSDP2 unit's device mesh spans 1 rank of the run's {rec.world} (read "
               "from FSDP2's parameter groups), so its reduce-scatter is over that rank "
               "alone; the gradients the optimizers received differ across the ranks at "
               f"step {_n(step)} (checksums {text}) and no collective reduced a gradient in "
               "any recorded step: the ranks never average their gradients, each trains its "
               "own model",
               title_="FSDP2 on a mesh of one rank: the ranks never synchronise their "
                      "gradients",
               fix="Pass fully_shard the mesh over all data-parallel ranks: the whole mesh "
                   "(HSDP: a 2-D (replicate, shard) mesh, both dimensions), not one of its "
                   "size-1 dimensions such as mesh[\"shard\"] of a (W, 1) mesh.")


def _never_synchronised(rec: RunRecording, ranks: list[int]) -> str | None:
    """No rank's window went through an engine that synchronises gradients (a DDP model
    counts only where a backward came from its forward: its sync flag was read), and no
    rank's script reduced a gradient of its own, in any step recorded (a parameter broadcast,
    as ZeroRedundancyOptimizer's, is no reduction): "" then, or "deepspeed" when a DeepSpeed
    engine ran the backwards but its ``engine.step()`` was never called (its micro-step
    counter, advanced there, never reached a boundary, where it reduces); else None."""
    deepspeed = False
    for r in ranks:
        for s in rec.steps[r]:
            comm = s.get("comm")
            rows = comm.get("rows", []) if isinstance(comm, dict) else []
            engine = s.get("engine")
            flags = s.get("sync_micros") or []
            if engine == "deepspeed" and s.get("source") == "torch" \
                    and not int(s.get("engine_step_calls") or 0) \
                    and not any(s.get("ds_boundaries") or []):
                deepspeed = True
            elif engine not in (None, "local", "ddp", "zero1") \
                    or any(x is not None for x in flags) \
                    or (engine in ("ddp", "zero1") and not flags):
                return None
            if int(s.get("grad_collective_rounds") or 0) or s.get("reductions") \
                    or any(row and row[0] in GRAD_OPS for row in rows):
                return None
    return "deepspeed" if deepspeed else ""


def _never_finding(step: int, evidence: str, never: str) -> Finding:
    """F10 (the averaging over ranks is missing) for a run that reduced no gradient."""
    if never == "deepspeed":
        return _mk("F10", "error", None, step, None,
                   evidence + "; no gradient was reduced across ranks in any recorded step: "
                   "the optimizer was stepped directly (its own step()) while DeepSpeed's "
                   "engine.step() was never called, so the engine's micro-step counter (advanced "
                   "in engine.step()) never reached an accumulation boundary, where it reduces "
                   "the gradients",
                   title_="ranks never synchronise their gradients: DeepSpeed's engine.step() "
                          "is never called",
                   fix="Call engine.step() after every engine.backward(loss): the engine counts "
                       "the micro-steps, reduces the gradients at the boundary of its "
                       "gradient_accumulation_steps and steps the optimizer there; do not call "
                       "the optimizer's step() or zero_grad() yourself.")
    return _mk("F10", "error", None, step, None,
               evidence + "; no gradient was reduced across ranks in any recorded "
               "step: no backward came from the forward of a data-parallel wrapper "
               "(DDP, FSDP2, DeepSpeed) and the script all-reduced no gradient "
               "itself. Either no wrapper holds the model, or its forward was "
               "bypassed (a loss computed through `ddp_model.module` or a method "
               "of it: DDP synchronises only the backward of a forward it ran)",
               title_="ranks never synchronise their gradients: each trains its "
                      "own model",
               fix="Compute the loss from the wrapped model's own forward "
                   "(`out = ddp_model(batch)`), not through `ddp_model.module` or "
                   "a method of it; if nothing wraps the model, wrap it (DDP, "
                   "FSDP2, DeepSpeed; ZeroRedundancyOptimizer shards the optimizer "
                   "state, it does not average gradients) or all-reduce the "
                   "gradients at each window's end. With Accelerate, check "
                   "`accelerator.distributed_type` in each process: on a CPU "
                   "machine it needs `Accelerator(cpu=True)` to run data-parallel "
                   "under torchrun or `accelerate launch`.")


def clipped_apart_findings(rec: RunRecording) -> list[Finding]:
    """F8: in a step seen on two or more ranks, the optimizer received the same gradient on
    every rank, but the norm clip after the window's last backward shrank each rank's
    gradient by a different factor (at least one below 1). A clip of the synchronised
    gradient sees one norm on every rank; different factors mean each rank clipped its own
    gradient by its own norm before the ranks' gradients were combined (a hand-written
    all-reduce after the clip)."""
    by_step = _by_step(rec)
    for step in sorted(by_step):
        row = by_step[step]
        clips = {r: float(s.conservation.clip) for r, s in row.items()
                 if s.conservation is not None and s.conservation.ok}
        sums = [s.checksum for s in row.values() if s.checksum]
        if len(clips) < 2 or len(sums) != len(row) or min(clips.values()) >= 1.0:
            continue
        scale = max(abs(v[2]) for v in sums) or 1e-30
        if max(abs(a[i] - b[i]) for a in sums for b in sums for i in (0, 1)) > 1e-5 * scale:
            continue  # the ranks received different gradients: F11's, not this rule's
        lo, hi = min(clips.values()), max(clips.values())
        if hi - lo <= 1e-4 * hi:
            continue
        factors = ", ".join(f"rank {r}: {c:.4g}" for r, c in sorted(clips.items()))
        return [_mk("F8", "error", None, step, None,
                    f"at optimizer step {_n(step)} every rank's optimizer received the same "
                    f"gradient, but the norm clip after the window's last backward shrank it by "
                    f"a different factor on each rank ({factors}): each rank clipped its own, "
                    "not yet synchronised gradient by its own norm, and the ranks' gradients "
                    "were combined after that (an all-reduce after the clip), so they are "
                    "rescaled unequally and the synchronised gradient's norm is never the one "
                    "clipped",
                    title_="gradient clipped on each rank before the ranks' gradients were "
                           "combined",
                    fix="Synchronise the gradients first (the all-reduce), then clip once, "
                        "right before the optimizer step.")]
    return []
