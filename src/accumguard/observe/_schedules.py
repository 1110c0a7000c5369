"""LR schedule horizons (F4): where a scheduler's schedule ends, and whether the run's
optimizer steps reach that end W or K times early or late.

Two halves. :func:`schedule_state` reads a live scheduler (duck-typed, no torch import) when
``watch`` records one of its steps: its position (``last_epoch``: real steps since it was
built, Accelerate's num_processes inner steps per call included) and, where the schedule
decays to an end that the object states, that end in scheduler steps. :func:`horizon_findings`
(pure, on the recording) compares the end with the optimizer steps the run made.

Only an exact factor tied to the run's structure is an error: the schedule ends W, K or W*K
times early or late (up to the per-epoch rounding of a partial window). A horizon longer than
the run by another factor is a run stopped early (``max_steps``, fewer epochs): silent. One
that ends early by another factor is a note (the rest of the run trains at the schedule's
final learning rate). A hand-written ``LambdaLR``'s horizon is the one integer its function
closes over under a horizon's name (``num_training_steps``...), or else reads from its module
under such a name (a global, or a global dict's entry it subscripts: ``HP["total_steps"]``). A
horizon the object does not state (a ``LambdaLR`` without such a variable, a warm-up-only ``LinearLR``, warm restarts) is not
judged.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from accumguard.core.window import StepRecord
from accumguard.observe._epochs import complete_epochs, epochs
from accumguard.observe._records import Finding, JsonObject, RunRecording, _mk, records

__all__ = ["deepspeed_schedulers", "explained_by_f1", "horizon_findings", "position",
           "run_horizon_findings", "schedule_state"]

#: end reasons of a recording whose run went to its own end (not cut by watch or a signal)
_COMPLETE = frozenset({"exit", "destroy_process_group"})


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _horizon(sched: object, depth: int = 0) -> tuple[int, str] | None:
    """The scheduler step at which the schedule reaches its end, and how it was read; None
    when the object states no end (or the schedule does not decay to one)."""
    name = type(sched).__name__
    if depth > 4:
        return None
    if name == "OneCycleLR":
        n = _int(getattr(sched, "total_steps", None))
        return (n, f"OneCycleLR total_steps={n}") if n else None
    if name == "CosineAnnealingLR":
        n = _int(getattr(sched, "T_max", None))
        return (n, f"CosineAnnealingLR T_max={n}") if n else None
    if name == "PolynomialLR":
        n = _int(getattr(sched, "total_iters", None))
        return (n, f"PolynomialLR total_iters={n}") if n else None
    if name == "LinearLR":  # a decay only: a rising LinearLR is a warm-up, not a horizon
        n = _int(getattr(sched, "total_iters", None))
        start, end = getattr(sched, "start_factor", None), getattr(sched, "end_factor", None)
        if n and isinstance(start, float | int) and isinstance(end, float | int) and end < start:
            return n, f"LinearLR total_iters={n} (decaying)"
        return None
    if name in ("WarmupDecayLR", "WarmupCosineLR"):  # DeepSpeed's: decay to total_num_steps
        n = _int(getattr(sched, "total_num_steps", None))
        return (n, f"DeepSpeed {name} total_num_steps={n}") if n else None
    if name == "SequentialLR":
        scheds = getattr(sched, "_schedulers", None)
        miles = getattr(sched, "_milestones", None)
        if isinstance(scheds, list) and isinstance(miles, list) and scheds and miles:
            last = _horizon(scheds[-1], depth + 1)
            m = _int(miles[-1])
            if last is not None and m is not None:
                return m + last[0], f"SequentialLR milestone {m} + {last[1]}"
        return None
    if name == "LambdaLR":
        lambdas = getattr(sched, "lr_lambdas", None)
        if isinstance(lambdas, list) and len(lambdas) >= 1:
            fn = lambdas[0]
            if (isinstance(fn, functools.partial)
                    and str(getattr(fn.func, "__module__", "")).startswith("transformers")):
                n = _int(fn.keywords.get("num_training_steps"))
                if n:
                    what = str(getattr(fn.func, "__name__", "schedule")).strip("_")
                    what = what.removeprefix("get_").removesuffix("_lr_lambda")
                    return n, f"transformers get_{what}(num_training_steps={n})"
            return _closure_horizon(fn)
    return None


#: a hand-written LambdaLR's horizon, read from the variable its function closes over
#: (``lambda s: 1 - s / num_training_steps`` built in a helper taking the horizon)
_HORIZON_NAME = re.compile(
    r"^(t_total|total|horizon|(num|total|max|n)_?(training_|train_|optimizer_|opt_)?"
    r"(steps|iters|iterations|updates)|(training|train)_?(steps|iters|iterations))$",
    re.IGNORECASE)


#: a number of processes or of micro-steps a schedule function may multiply its horizon by
_SCALE_NAME = re.compile(
    r"^(w|k|world|world_?size|n_?procs?|num_?processes|n_?gpus?|num_?gpus|nproc|ws|"
    r"accum|grad_?accum(_?steps)?|accum(ulation)?_?steps|accumulate(_grad_batches)?|gas|ga|"
    r"gradient_accumulation_steps)$",
    re.IGNORECASE)


def _closure_horizon(fn: object) -> tuple[int, str] | None:
    """The one integer a hand-written schedule function closes over under a horizon's name
    (``num_training_steps``, ``total_steps``, ``max_iters``...); None when there is none or
    more than one (a warm-up length is not among the names)."""
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None)
    names = getattr(code, "co_freevars", None)
    if not isinstance(cells, tuple) or not isinstance(names, tuple) or len(names) != len(cells):
        cells, names = (), ()  # (no closure: a module-level function)
    found: list[tuple[int, str]] = []
    for name, cell in zip(names, cells, strict=True):
        if not isinstance(name, str):
            continue
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if _HORIZON_NAME.match(name) and _int(value):
            found.append((int(value), name))
        elif _SCALE_NAME.match(name) and _int(value) and int(value) > 1:
            # the function may scale its horizon by it (``t / (total * W)``, a prepared
            # scheduler stepped W times per optimizer step): the horizon is not read
            return None
        else:
            held = _held_settings(name, value, code)
            if held is None:
                return None
            found += held
    g = getattr(fn, "__globals__", None)
    if isinstance(g, dict) and any(
            isinstance(n, str) and _SCALE_NAME.match(n) and _int(g.get(n)) and int(g[n]) > 1
            for n in getattr(code, "co_names", ()) or ()):
        return None  # a module-level W or K the function may scale its horizon by
    if not found:
        found = _global_horizons(fn, code)
    if len(found) != 1:
        return None
    n, name = found[0]
    return n, f"LambdaLR function's {name}={n}"


def _held_settings(name: str, value: object, code: object) -> list[tuple[int, str]] | None:
    """The horizons a schedule function reads through a settings holder it closes over:
    a dict (Lightning's ``hp = self.hparams``, then ``hp.total_steps``) or the module itself
    (``self.hparams.total_steps``, ``self.total_steps``), by the attribute names and string
    keys the function reads. None when it reads a W or K > 1 there too (it may scale its
    horizon by it). Plain instance and dict storage only: nothing of the user's is called."""
    names = getattr(code, "co_names", None)
    consts = getattr(code, "co_consts", None)
    if not isinstance(names, tuple) or not isinstance(consts, tuple):
        return []
    attrs = [n for n in names if isinstance(n, str)]
    wanted = attrs + [c for c in consts if isinstance(c, str)]
    holders: list[tuple[dict[object, object], str, list[str]]] = []
    if isinstance(value, dict):
        holders.append((value, name, wanted))
    else:
        try:
            own = object.__getattribute__(value, "__dict__")
        except (AttributeError, TypeError):
            return []
        if type(own) is not dict:
            return []
        holders.append((own, name, attrs))
        for attr in attrs:  # a settings dict the object holds (``hparams`` is ``_hparams``)
            for key in (attr, "_" + attr):
                inner = dict.get(own, key)
                if isinstance(inner, dict):
                    holders.append((inner, f"{name}.{attr}", wanted))
    found: list[tuple[int, str]] = []
    for store, where, keys in holders:
        for key in keys:
            entry = _int(dict.get(store, key))
            if entry is None:
                continue
            if _HORIZON_NAME.match(key):
                found.append((entry, f"{where}.{key}"))
            elif _SCALE_NAME.match(key) and entry > 1:
                return None
    return found[:1] if len({n for n, _ in found}) == 1 else found


def _global_horizons(fn: object, code: object) -> list[tuple[int, str]]:
    """The integers a schedule function reads from its module under a horizon's name: a
    global (``TOTAL_STEPS``) or the entry of a global dict that the function subscripts with
    that key (``HP["total_steps"]``: the key is among its constants). Plain dicts and ints
    only: nothing of the user's is called or its attributes read."""
    g = getattr(fn, "__globals__", None)
    names = getattr(code, "co_names", None)
    consts = getattr(code, "co_consts", None)
    if type(g) is not dict or not isinstance(names, tuple) or not isinstance(consts, tuple):
        return []
    keys = [c for c in consts if isinstance(c, str) and _HORIZON_NAME.match(c)]
    found = []
    for name in names:
        value = dict.get(g, name) if isinstance(name, str) else None
        if _int(value) and _HORIZON_NAME.match(name):
            found.append((int(value), name))  # type: ignore[arg-type]
        elif type(value) is dict:
            for key in keys:
                entry = dict.get(value, key)
                if _int(entry):
                    found.append((int(entry), f"{name}[{key!r}]"))  # type: ignore[arg-type]
    return found


def deepspeed_schedulers(mod: object) -> list[type]:
    """The classes of ``deepspeed.runtime.lr_schedules`` whose own ``step`` moves a schedule
    (WarmupLR, WarmupCosineLR, OneCycle, LRRangeTest; WarmupDecayLR steps through WarmupLR's)."""
    name = getattr(mod, "__name__", "")
    return [c for c in vars(mod).values() if isinstance(c, type) and c.__module__ == name
            and "step" in vars(c) and callable(getattr(c, "get_lr", None))]


def position(sched: object) -> int | None:
    """Scheduler steps made so far: torch's ``last_epoch``, or DeepSpeed's
    ``last_batch_iteration`` + 1 (its schedulers are no torch ``LRScheduler`` and start at
    -1)."""
    pos = _int(getattr(sched, "last_epoch", None))
    if pos is not None:
        return pos
    last = _int(getattr(sched, "last_batch_iteration", None))  # -1 before the first step
    return None if last is None else last + 1


def schedule_state(sched: object) -> dict[str, object]:
    """Fields for the scheduler record: ``sid`` (the object), ``pos`` (its ``last_epoch``
    after this step) and, where stated, ``horizon`` with ``horizon_what``."""
    out: dict[str, object] = {"sid": id(sched)}
    pos = _int(getattr(sched, "last_epoch", None))  # (torch's, without a call more per step)
    if pos is None:
        pos = position(sched)
    if pos is not None:
        out["pos"] = pos
    h = _horizon(sched)
    if h is not None:
        out["horizon"], out["horizon_what"] = h
    return out


def _factors(world: int, k: int | None) -> list[tuple[int, str]]:
    """The run's structural factors (value, name): W, K, W*K (each > 1)."""
    out: dict[int, list[str]] = {}
    kk = k if k is not None and k > 1 else 1
    cands = [(world, f"W = {world} ranks"), (kk, f"K = {kk}")]
    if world > 1 and kk > 1:
        cands.append((world * kk, f"W*K = {world * kk}"))
    for v, name in cands:
        if v > 1:
            out.setdefault(v, []).append(name)
    return [(v, " = ".join(names)) for v, names in out.items()]


def _match(big: float, small: float, c: int, slack: int) -> bool:
    """``big`` is ``c`` times ``small`` up to the rounding of a partial window per epoch
    (at most c - 1 micro-batches of each of ``slack`` epochs), and within 1/8."""
    return abs(big - c * small) <= (c - 1) * slack and abs(big / (c * small) - 1) <= 0.125


def horizon_findings(rank: int, events: list[JsonObject], total_steps: int,
                     world: int, k: int | None, epochs: int, complete: bool, *,
                     backwards: int = 0, whole_epochs: bool = False,
                     serials: list[int | None] | None = None,
                     step_backwards: list[int] | None = None,
                     k_scheduled: bool = False, warm_up: bool = False) -> list[Finding]:
    """F4 from a stated horizon. ``events``: the rank's scheduler records; ``total_steps``:
    the optimizer steps the rank made; ``epochs``: passes over a DataLoader seen (the slack
    of per-epoch rounding); ``complete``: the run went to its own end (a horizon longer
    than a run cut short proves nothing); ``backwards``: the rank's backward passes;
    ``whole_epochs``: its passes over the data were all of one length (it did not break out
    of the last one); ``serials``: per optimizer step, which optimizer object made it (a
    schedule is compared with the steps of the optimizers that stepped while it lived: a
    reference run's or a second phase's optimizer after the training's is not its run);
    ``step_backwards``: per optimizer step, its window's backward passes (the phase's own
    count of them, when other optimizers stepped outside it); ``k_scheduled``: a framework
    set K per epoch (Lightning's GradientAccumulationScheduler).

    A schedule that ends late by W or K is an error only when the run went through whole
    passes over the data, or when the horizon is exactly the run's count of backward passes
    (the schedule counted micro-batches): otherwise a horizon planned for more epochs than
    the run made (a ``max_steps`` cut) looks the same, and it is a note."""
    # one group per scheduler object; a position that goes back (or a new horizon) under
    # the same id is another object built at a freed address (a rebuilt scheduler)
    groups: list[list[JsonObject]] = []
    last_of: dict[int, list[JsonObject]] = {}
    for e in events:
        if not (isinstance(e.get("pos"), int) and isinstance(e.get("horizon"), int)):
            continue
        sid = int(e.get("sid", 0))
        cur = last_of.get(sid)
        if cur is None or int(e["pos"]) < int(cur[-1]["pos"]) or e["horizon"] != cur[-1]["horizon"]:
            cur = last_of[sid] = []
            groups.append(cur)
        cur.append(e)
    out: list[Finding] = []
    slack = max(1, epochs)
    for evs in groups:
        first, last = evs[0], evs[-1]
        h, what = int(last["horizon"]), str(last.get("horizon_what", "its horizon"))
        if len(evs) < 2:
            continue
        # the position before the first recorded call (a resumed schedule starts further on;
        # one call may make several steps: Accelerate's num_processes), from the second call
        pos0 = int(first["pos"]) - max(0, int(evs[1]["pos"]) - int(first["pos"]))
        pos_end = int(last["pos"])
        off, own = _phase(serials, evs, total_steps)
        when = _clock(evs, total_steps, off)
        steps = max(own, when(last))
        # the optimizer steps this scheduler object lived for (a scheduler rebuilt on resume
        # lives for the run's second part only), counted like ``pos0``
        # (at least the windows it stepped in: a scheduler stepped per micro-step before the
        # window's optimizer step makes its first calls at optimizer step 0)
        span = max(when(last) - (when(first) - max(0, when(evs[1]) - when(first))),
                   when(last) - when(first) + 1)
        advanced = pos_end - pos0
        if steps < 4 or advanced < 2 or h <= pos0 or span < 1:
            continue
        per_step = advanced / span
        rate = (f"{advanced} scheduler steps over "
                + (f"the run's {steps}" if span == steps else f"{span} of the run's {steps}")
                + " optimizer steps"
                + (f" ({per_step:.3g} per optimizer step)" if abs(per_step - 1) > 1e-9 else ""))
        crossed = next((e for e in evs if int(e["pos"]) >= h), None)
        if crossed is not None:  # the schedule reached its end inside the run
            at = max(1, when(crossed))
            ratio = steps / at
            # where between two optimizer steps the horizon was crossed, at the measured
            # rate (an odd horizon of a short run: 5 at 2 per step ends at 2.5, W x early,
            # though its first step past the end is 3)
            end_at = when(first) - max(0, when(evs[1]) - when(first)) + (h - pos0) / per_step
            # a run cut short: S is not the run's total, so no factor is claimed
            hit = next(((c, name) for c, name in _factors(world, k)
                        if complete and (_match(steps, at, c, slack) or _match(steps, end_at, c, slack))),
                       None)
            if hit is None and complete and abs(per_step - 1) < 1e-9:
                # the horizon is the run's steps floor-divided by W or K
                # (`estimated_stepping_batches // K` over 8 steps at K = 3: 2), which the
                # tolerance above misses on a short run; one factor only (a rounding up is
                # not claimed: 3 of 5 steps is no more 2x early than 5 / 3)
                floors = [(c, name) for c, name in _factors(world, k)
                          if pos_end >= 2 * c and h == pos_end // c]
                hit = floors[0] if len(floors) == 1 else None
            # or: the horizon counts the run's optimizer steps (up to a step per epoch, as
            # `num_training_steps = steps + 1` does) while the scheduler advances exactly W
            # or K per optimizer step (blind round 49 a_b02: 6 for 5 steps at 2 per step)
            fast = None if hit is not None or not complete else next(
                ((c, name) for c, name in _factors(world, k)
                 if abs(per_step - c) < 1e-9 and abs(h - pos0 - span) <= slack), None)
            pick = hit if hit is not None else fast
            if pick is not None and warm_up and hit is not None:
                # the rates rose to the end and held it: a warm-up, whose length is its own
                # choice, not the run's (three warm-up steps of a twelve-step run "end 4x
                # early" by the same arithmetic)
                out.append(_mk("F4", "note", rank, at - 1, None,
                               f"the LR schedule ({what}) reached its end at optimizer step "
                               f"{at} of the run's {steps} ({rate}) and the learning rate then "
                               "held its highest value: a warm-up, whose length is not judged "
                               "against the run's",
                               title_="a warm-up reached its peak (length not judged)"))
            elif pick is not None:
                c, name = pick
                why = (f"it ends {c}x early ({name})" if hit is not None else
                       f"its horizon ({h - pos0}) counts the {span} optimizer steps it lived "
                       f"for, while it advances {c} per optimizer step ({name}): it runs {c}x "
                       "fast")
                out.append(_mk("F4", "error", rank, at - 1, None,
                               f"the LR schedule ({what}) reached its end at optimizer step "
                               f"{at} of the run's {steps} ({rate}): {why}; the remaining "
                               f"{steps - at} steps ran at the schedule's final learning rate",
                               title_=(f"LR schedule ends {c}x early" if hit is not None else
                                       f"LR schedule runs {c}x fast, ends early")
                                      + f": horizon {h} scheduler steps, reached at optimizer "
                                      f"step {at} of {steps}",
                               fix=_fix(per_step, what)))
            elif ratio >= 1.25 and steps - at >= 2 and not any(
                    int(e.get("micro", 0)) and not e.get("in_step") for e in evs):
                # (a scheduler that also steps between backwards is the step-count rule's
                # error: its end, reached inside a window, is no whole step of this clock)
                out.append(_mk("F4", "note", rank, at - 1, None,
                               f"the LR schedule ({what}) reached its end at optimizer step "
                               f"{at} of the run's {steps} ({rate}); the remaining "
                               f"{steps - at} steps ran at its final learning rate. "
                               + ("Not a factor of W or K: fine if intended" if complete else
                                  "The run was cut short (watch --max-steps, a signal): its "
                                  "full length, and so the factor, is unknown"),
                               title_=f"LR schedule ended at optimizer step {at} of {steps}",
                               fix=_fix(per_step, what)))
            continue
        if not complete or not all(g is evs or _apart(serials, g, total_steps, (off, own))
                                   for g in groups):
            continue  # (a rebuilt schedule's rate over the whole run is not its own)
        end_at = (h - pos0) / per_step  # the optimizer step at which it would end
        late = next(((f"{c}", name) for c, name in _factors(world, k)
                    if _match(end_at, steps, c, slack)), None)
        if step_backwards is not None and len(step_backwards) == total_steps and own < total_steps:
            backwards = sum(step_backwards[off:off + own])  # this schedule's phase only
        micro = backwards > steps and h - pos0 == backwards
        if late is None and micro and abs(per_step - 1) < 1e-9:
            # the horizon is the run's count of micro-batches, K varying over the run (a K
            # set per epoch): no one factor, the count itself is the evidence
            late = (f"{end_at / steps:.3g}", f"{h - pos0} / {steps}")
        if late is None:
            continue
        sure = whole_epochs or micro
        text = (f"the LR schedule ({what}) was at scheduler step {pos_end} of its {h} when "
                f"the run ended after {steps} optimizer steps ({rate}): at this rate it would "
                f"end at optimizer step {end_at:.0f}, {late[0]}x late ({late[1]})"
                + (f"; its horizon is the run's {backwards} backward passes: it counts "
                   "micro-batches, not optimizer steps" if micro else "")
                + f": the learning rate never went through the last "
                  f"{100 * (1 - pos_end / h):.0f}% of its schedule")
        if not sure:
            text += (". The run did not go through whole passes over the data: if it was "
                     "stopped early on purpose (max_steps), this is expected")
        fix = _fix(per_step, what)
        if micro and k_scheduled:
            fix = fix[:-1] + _SCHEDULED_K_FIX
        out.append(_mk("F4", "error" if sure else "note", rank, steps - 1, None, text,
                       title_=f"LR schedule ends {late[0]}x late: horizon {h} scheduler steps, "
                              f"{pos_end} reached in the run's {steps} optimizer steps",
                       fix=fix))
    return out


#: the fix's words when K was set per epoch and the horizon counts micro-batches
_SCHEDULED_K_FIX = ("; with K set per epoch (Lightning's GradientAccumulationScheduler, which "
                    "sets it at each epoch's start, after configure_optimizers: "
                    "trainer.estimated_stepping_batches read there counts every batch as a "
                    "step), sum ceil(batches per epoch per rank / that epoch's K) over the "
                    "epochs.")


def _apart(serials: list[int | None] | None, evs: list[JsonObject], total_steps: int,
           phase: tuple[int, int]) -> bool:
    """Another scheduler's records ``evs`` belong to optimizers of their own, stepping
    outside ``phase`` (a large-batch reference run after the training, with a schedule
    built fresh): they say nothing of the schedule of ``phase``. A schedule rebuilt on resume
    continues from a position past its start, or steps the same optimizer: not apart."""
    if len(evs) < 2:
        return True
    off, own = _phase(serials, evs, total_steps)
    fresh = int(evs[0]["pos"]) - max(0, int(evs[1]["pos"]) - int(evs[0]["pos"])) == 0
    return fresh and own < total_steps and phase[1] < total_steps and (
        off >= phase[0] + phase[1] or phase[0] >= off + own)


def _phase(serials: list[int | None] | None, evs: list[JsonObject], total_steps: int
           ) -> tuple[int, int]:
    """(steps before, steps of) the optimizers that stepped while the schedule lived, when
    those steps are one stretch of the run and other optimizer objects stepped outside it
    (a large-batch reference run after the training); else (0, ``total_steps``)."""
    if (not serials or len(serials) != total_steps or None in serials or len(set(serials)) < 2
            or not all(isinstance(e.get("step"), int) for e in evs)):
        return 0, total_steps
    # (a record's step is the optimizer steps made so far: the last one before it is step - 1)
    lo = max(0, int(evs[0]["step"]) - 1)
    hi = min(total_steps, max(lo + 1, int(evs[-1]["step"])))
    live = set(serials[lo:hi])
    idx = [i for i, s in enumerate(serials) if s in live]
    if not idx or idx != list(range(idx[0], idx[-1] + 1)):
        return 0, total_steps
    return idx[0], len(idx)


def _clock(evs: list[JsonObject], total_steps: int, off: int = 0
           ) -> Callable[[JsonObject], int]:
    """The optimizer step at a scheduler record, on the run's clock (``total_steps``'s):
    the recording's step count when the run has one optimizer (a rebuilt optimizer, on
    resume, restarts its own count), else the scheduler's optimizer's own count."""
    if total_steps > 0 and all(isinstance(e.get("step"), int) for e in evs):
        return lambda e: int(e["step"]) - off  # (``off``: the steps of an earlier phase)
    return lambda e: int(e.get("optimizer_steps", 0))


def _fix(per_step: float, what: str = "") -> str:
    if what.startswith("DeepSpeed"):
        return ("Set the config's scheduler `total_num_steps` to the optimizer steps the run "
                "makes: ceil(batches per epoch per rank / gradient_accumulation_steps) x epochs "
                "(the engine steps its scheduler once per optimizer step, not per micro-batch, "
                "and each rank sees its own share of the data).")
    text = ("Compute the horizon in the scheduler steps the run makes: optimizer steps = "
            "ceil(batches per epoch per rank / K) x epochs (batches per rank after the "
            "DistributedSampler / accelerator.prepare split the data)")
    if per_step > 1.5:
        text += (f"; this scheduler advances {per_step:.3g} steps per optimizer step (Accelerate"
                 " steps a prepared scheduler num_processes times per optimizer step unless "
                 "split_batches=True: give it num_processes x the optimizer steps, as the "
                 "horizon computed from the unprepared DataLoader's length does)")
    return text + "."


def run_horizon_findings(rec: RunRecording, rank: int, k: int | None) -> list[Finding]:
    """:func:`horizon_findings` on one rank of a recording: its optimizer steps (the step
    records of a single optimizer; with several, the scheduler's own optimizer's count),
    its DataLoader passes, and whether the run went to its own end."""
    steps = records(rec.steps.get(rank, []))
    several = len({s.optimizer_index for s in steps} - {None}) > 1
    total = 0 if several else len(steps)
    eps = epochs(steps)
    end = rec.end.get(rank, {})
    complete = end.get("reason") in _COMPLETE and not rec.failures
    backwards = 0 if several else sum(int(s.backwards or 0) for s in steps)
    pending = int(end.get("pending_backwards", 0) or 0)
    events = rec.schedulers.get(rank, [])
    tail = rec.tail.get(rank)
    if tail is not None and not tail.get("unknown") and not rec.failures:
        # observation ended early (observe_steps) and the rest of the run was counted:
        # judged on the whole run's totals and each scheduler's final state
        n_eps, whole = _passes(steps, tail)
        return horizon_findings(
            rank, [*events, *tail.get("schedulers", [])],
            0 if several else total + int(tail.get("steps", 0)), rec.world, k, n_eps,
            tail.get("reason") in _COMPLETE,
            backwards=0 if several else backwards + int(tail.get("backwards", 0)),
            whole_epochs=whole, serials=None)
    return horizon_findings(rank, events, total, rec.world, k, len(eps),
                            complete, backwards=backwards, warm_up=_rises_to_plateau(
                                rec.steps.get(rank, [])),
                            whole_epochs=complete_epochs(steps, pending),
                            serials=[s.opt_serial for s in steps],
                            step_backwards=[int(s.backwards or 0) for s in steps],
                            k_scheduled=bool(end.get("k_changes")) and "Lightning" in str(
                                end.get("k_changes_by") or "Lightning"))


def _rises_to_plateau(steps: list[JsonObject]) -> bool:
    """Every optimizer's recorded learning rate never fell over the run and one of them rose:
    a warm-up to a constant rate (a schedule that decays shows it falling)."""
    by_opt: dict[object, list[float]] = {}
    for s in steps:
        lr = s.get("lr")
        if isinstance(lr, (int, float)) and not isinstance(lr, bool):
            by_opt.setdefault(s.get("optimizer_index"), []).append(float(lr))
    rose = False
    for rates in by_opt.values():
        for a, b in zip(rates, rates[1:], strict=False):
            if b < a * (1 - 1e-9):
                return False
            rose = rose or b > a * (1 + 1e-9)
    return rose


def _passes(steps: list[StepRecord], tail: JsonObject) -> tuple[int, bool]:
    """(DataLoader passes, all of one length in backward passes) over the observed windows
    and the counted rest of the run (:mod:`._tail`)."""
    starts: list[int] = []
    total = 0
    for s in steps:
        n = int(s.backwards or 0)
        starts += [total + int(j) for j in s.data_pass_starts or [] if 0 <= int(j) <= n]
        total += n
    starts += [total + int(j) for j in tail.get("passes", [])]
    total += int(tail.get("backwards", 0))
    ends = total - int(tail.get("pending_backwards", 0) or 0)
    if not starts:
        return 0, False
    lengths = [b - a for a, b in zip(starts, [*starts[1:], ends], strict=True)]
    return len(starts), len(starts) >= 2 and len(set(lengths)) == 1


def explained_by_f1(horizon: list[Finding], findings: list[Finding], rank: int) -> list[Finding]:
    """``horizon`` (:func:`run_horizon_findings`) without its "ends K x early" errors when
    ``findings`` hold F1 for this rank: the optimizer stepped after every backward while K
    was declared, so a horizon sized for the declared K's steps ends K x early as a
    consequence; F1's fix mends it, and "re-size the horizon" would contradict that fix."""
    if not any(f.cls == "F1" and f.severity == "error" and f.rank in (rank, None)
               for f in findings):
        return horizon
    return [f for f in horizon
            if not (f.cls == "F4" and f.severity == "error" and "(K = " in f.evidence)]
