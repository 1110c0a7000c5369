"""Rules about one optimizer step's own events (split from :mod:`.rules`, which keeps the
window and cross-rank rules): a step with no backward since the same optimizer's previous
step (EXTRA_STEP), the gradient-sync flags of a window (DDP/FSDP2: F11, EXTRA_SYNC), steps
that received no gradient (NO_UPDATE), scheduler steps per optimizer step (F4), and a norm
clip of the GradScaler-scaled gradient (F8).

No torch here, as in :mod:`.rules`.
"""

from __future__ import annotations

from collections.abc import Sequence

from accumguard.core.window import StepRecord
from accumguard.observe._catch_up import catch_up
from accumguard.observe._records import Finding, JsonObject, Severity, StepWindow, _mk, _n
from accumguard.observe._shared_rules import micro_sync, scheduler_ahead

__all__ = ["_extra_step", "_no_update", "_two_pass", "_scaled_clip_finding", "_scheduler_findings",
           "_sync_findings"]


def _extra_step(rank: int, w: StepRecord) -> list[Finding]:
    """The optimizer (or DeepSpeed engine) of the previous step stepping again with no
    backward pass in between (an engine stepping again at a boundary that stayed set, a
    second ``optimizer.step()``): an error when it changed the parameters (measured by the
    observer, ``moved_without_backward``), nothing when it was a no-op or not measured
    (another optimizer's step, the first step)."""
    if not w.moved_without_backward:
        return []
    step = w.step
    what = ("the DeepSpeed engine (engine.step() at an accumulation boundary)"
            if w.source == "deepspeed" else f"the optimizer ({w.optimizer})")
    return [_mk("EXTRA_STEP", "error", rank, step, None,
                f"optimizer step {_n(step)}: {what} stepped again with no backward pass since "
                f"its previous step (optimizer step {step}) and changed the parameters: an "
                "update the large batch does not make")]


#: what the sync-flag F11 claims, read from the flags: the ranks' received gradients, when
#: every rank's was measured and they agree, disprove it (``rules.analyze`` drops it then)
UNREDUCED = "the optimizer stepped on gradients not reduced across ranks"


def _sync_findings(rank: int, w: StepRecord) -> list[Finding]:
    """DDP (flag at the forward decides) and FSDP2 (flag at the backward decides): the
    window's last backward must synchronise; syncing earlier ones is only wasteful."""
    engine = w.engine
    step = w.step
    if engine == "ddp":
        syncs = w.sync_micros or []
        what = "DDP sync off at its forward (require_backward_grad_sync=False / inside no_sync)"
    elif engine == "fsdp2":
        syncs = w.sync_backward or w.sync_micros or []
        what = "FSDP2 gradient sync off (set_requires_gradient_sync(False))"
    else:
        return []
    if not syncs or any(s is None for s in syncs):
        return []
    if w.forwards and not any(w.forwards):
        return []  # no forward of the watched model in the window (a reference model's)
    mism = w.sync_mismatch or [] if engine == "ddp" else []
    # the guard judges each backward with the same rule as it happens
    verdicts = [micro_sync(s, last=j == len(syncs) - 1) for j, s in enumerate(syncs)]
    if verdicts[-1] == "unsynced_last":
        synced = [j + 1 for j, s in enumerate(syncs) if s]
        return [_mk("F11", "error", rank, step, len(syncs) - 1,
                    f"the window's last backward (micro-step {len(syncs)} of {len(syncs)}) ran "
                    f"with {what}; {UNREDUCED}"
                    + (f" (micro-step(s) {synced} synchronised instead"
                       + (f"; the flag changed between forward and backward on micro-step(s) "
                          f"{[m + 1 for m in mism]}: DDP reads it at the forward, so a flag "
                          "set after the forward applies one micro-step late)" if mism else
                          ": the flag is inverted)") if synced else
                       (f"; the flag changed between forward and backward on micro-step(s) "
                        f"{[m + 1 for m in mism]}: DDP reads it at the forward" if mism
                        else "")))]
    extra = verdicts.count("extra")
    if not extra:
        return []
    how = (f" (no_sync entered after the forward on micro-step(s) {[m + 1 for m in mism]}: "
           "it only wraps the backward, DDP had already decided to reduce)" if mism else "")
    fix = ("Run forward and backward of micro-steps 1..K-1 inside model.no_sync() to save "
           "them." if engine == "ddp" else "Call model.set_requires_gradient_sync(False) "
           "before micro-steps 1..K-1 and True before the last to save them.")
    n = len(syncs)
    which = "every micro-step" if extra == n - 1 else f"{extra} of {n - 1} non-final micro-steps"
    # A cost, never a verdict on the update: other rules judge the same step (an F8 clip, a
    # wrong scale) and this note must not read as "correct" next to them.
    return [_mk("EXTRA_SYNC", "note", rank, step, None,
                f"{extra} of the {n - 1} micro-step(s) before the window's last one "
                f"all-reduced their gradient{how}: {extra} extra gradient reduction round(s) per "
                "optimizer step. This costs communication only; it does not change the "
                "gradient the optimizer receives",
                title_=f"gradients synchronised on {which}: {extra} extra all-reduce "
                       "round(s) per optimizer step", fix=fix)]


def _two_pass(rank: int, steps: Sequence[StepRecord]) -> list[Finding]:
    """A note, once: windows begun again at a zero_grad that followed an in-place change of
    the parameters with no optimizer step (the observer's restart): sharpness-aware
    minimisation and weight perturbations clear the first pass's gradient on purpose."""
    hit = [w for w in steps if int(getattr(w, "restarts", 0) or 0)]
    if not hit:
        return []
    w = hit[0]
    return [_mk("F3", "note", rank, w.step, None,
                f"in {len(hit)} of {len(steps)} optimizer step(s) (first: step {_n(w.step)}) "
                "the parameters were changed in place after backward passes without an "
                "optimizer step, and then zero_grad() cleared the gradient before more "
                "backward passes: a two-pass step (sharpness-aware minimisation's ascent, a "
                "weight perturbation). The gradient of the first pass is meant to be cleared; "
                "each such window is judged from that zero_grad on (the pass after it: "
                f"{w.backwards} backward pass(es) at step {_n(w.step)})",
                title_="two-pass step (SAM-like): judged from its second pass, not a zero_grad "
                       "inside the window",
                fix="Nothing to fix if the parameters are perturbed on purpose (SAM, ASAM, "
                    "weight perturbation); accumulate the same K micro-batches in both passes.")]


def _no_update(rank: int, steps: Sequence[StepRecord]) -> list[Finding]:
    """Optimizer steps after backward passes in which no gradient reached the optimizer.

    A no-op step (every gradient None) whose window goes on into a later applied step lost
    nothing: the rules fold its backwards into that step (:func:`_windows`). FSDP2 with
    ``set_requires_gradient_sync(False)`` hands ``.grad = None`` to the steps of the
    non-final micro-steps and keeps the unreduced gradient until the synced backward, so
    ``step()`` + ``zero_grad()`` after every micro-step is the large-batch update with
    wasted calls (a note). An error only when no step ever applied anything, or when the
    run ended on FSDP2 no-op steps whose gradient never reached a step."""
    skipped = [s for s in steps if not s.applied]
    if not skipped or not any(int(s.backwards) for s in steps):
        return []
    never = not any(s.applied for s in steps)
    pending: list[StepRecord] = []  # no-op steps not (yet) followed by an applied one
    folded: list[StepRecord] = []  # no-op steps whose window an applied step carried on
    for s in steps:
        if s.discarded:
            pending = []
        elif not s.applied:
            pending.append(s)
        else:
            folded += pending
            pending = []

    def fsdp_off(s: StepRecord) -> bool:
        return bool(s.engine == "fsdp2" and s.sync_backward
                    and not any(s.sync_backward))

    trailing = [s for s in pending if fsdp_off(s)]
    if never or trailing:
        first = (trailing or skipped)[0]
        if never:
            why = (" (every backward ran with FSDP2 gradient sync off: "
                   "set_requires_gradient_sync(True) was never called before a window's last "
                   "backward, so no gradient was reduced)"
                   if all(fsdp_off(s) for s in skipped) else "")
            return [_mk("NO_UPDATE", "error", rank, first.step, None,
                        f"{len(skipped)} of {len(steps)} optimizer steps found every gradient "
                        f"None (first: step {_n(first.step)}; "
                        f"{sum(int(s.backwards) for s in steps)} backward passes in "
                        f"the whole run){why}: the parameters did not move")]
        nb = sum(int(s.backwards) for s in trailing)
        return [_mk("NO_UPDATE", "error", rank, first.step, None,
                    f"the run's last {len(trailing)} optimizer step(s) (from step "
                    f"{_n(first.step)}) found every gradient None: their {nb} backward "
                    "pass(es) ran with FSDP2 gradient sync off "
                    "(set_requires_gradient_sync(False)) and no synced backward and applied "
                    "step followed, so their gradient never reached the optimizer")]
    wasted = [s for s in folded if fsdp_off(s)]
    if not wasted:
        return []
    return [Finding("OK", Severity.NOTE, rank, _n(wasted[0].step), None,
                    f"{len(wasted)} of {len(steps)} optimizer.step() calls came after a "
                    "backward with FSDP2 gradient sync off and found every gradient None "
                    "(FSDP2 keeps the unreduced gradient until the synced backward): they "
                    "changed nothing, and the window went on to the next applied step, so the "
                    "update is the large batch's",
                    "Call optimizer.step() and zero_grad() only after the window's last "
                    "(synced) backward: the other calls do nothing.",
                    "correct, with optimizer.step() calls that do nothing")]


def _scheduler_findings(rank: int, events: list[JsonObject],
                        windows: list[StepWindow] | None = None) -> list[Finding]:
    """F4: a scheduler that stepped more often than its optimizer. An error, unless the
    schedule states its end (its horizon) and the run's last step of it lands exactly there:
    then the horizon was counted in the steps it is given (``num_training_steps`` in
    micro-batches, or W x the optimizer steps for a scheduler stepped once per process, as
    Accelerate's prepared one is) and the learning rate at each optimizer step is the
    schedule's at the same fraction of the run. Extra steps all made at the boundary (none
    between two backwards of a window: a loop of scheduler steps after the optimizer's)
    then say nothing; extra steps between backwards are still an error: the large batch
    steps the same scheduler once per optimizer step, so its warm-up and milestones come K x
    later in optimizer steps than here. A scheduler fast-forwarded for a resume is judged by
    :func:`._catch_up.catch_up`, and from its new position here."""
    offsets, found = catch_up(rank, events, windows)
    if any(f.severity == Severity.ERROR for f in found):
        return found
    return found + _ahead(rank, events, offsets, windows)


def _ahead(rank: int, events: list[JsonObject], offsets: dict[object, int],
           windows: list[StepWindow] | None) -> list[Finding]:
    for e in events:
        off = offsets.get(e.get("sid"), 0)
        if not e.get("in_step") and not e.get("fresh") and scheduler_ahead(
                int(e["count"]) - off, int(e["optimizer_steps"]), allowance=1):
            micro = int(e["micro"])  # backward passes before it: after micro-step `micro`
            mine = [x for x in events if x.get("sid") == e.get("sid")]
            last = mine[-1]
            horizon, pos = last.get("horizon"), last.get("pos", last.get("count"))
            # (a last call made between backwards belongs to the window its step closes)
            closing = int(last["optimizer_steps"]) + int(bool(int(last["micro"])) and not last.get("in_step"))
            ratio = int(last["count"]) / max(closing, 1)
            consumed = isinstance(horizon, int) and isinstance(pos, int) and horizon > 0 \
                and abs(pos - horizon) <= max(ratio, 1.0)
            text = (f"the LR scheduler had stepped {e['count']} times when its "
                    f"optimizer had stepped {e['optimizer_steps']} times (seen after "
                    f"{micro} backward pass(es) of optimizer step {_n(int(e['step']))}): ")
            if not consumed:
                return [_mk("F4", "error", rank, int(e["step"]), micro - 1 if micro else None,
                            text + "it steps per micro-step or per process, not once per "
                            "optimizer step")]
            where = (f"its last step reached position {pos} of the {horizon} its schedule "
                     f"states ({last.get('horizon_what') or 'its horizon'}) at the run's "
                     f"last optimizer step, {ratio:.3g} scheduler steps per optimizer step")
            if all(int(x["micro"]) == 0 for x in mine if not x.get("in_step")):
                return [_mk("F4", "note", rank, int(e["step"]), None,
                            text + "every scheduler step came at a boundary, and " + where
                            + ": the horizon was counted in the steps it is given, so the "
                            "schedule ends with the run (not judged an error)",
                            title_="the LR scheduler steps several times per optimizer step, "
                                   "on a horizon counted for it",
                            fix="Nothing to fix if the horizon was counted for these steps; "
                                "if it was meant in optimizer steps, step the scheduler once "
                                "per optimizer step.")]
            return [_mk("F4", "error", rank, int(e["step"]), micro - 1 if micro else None,
                        text + "it steps between the backwards of a window, and " + where
                        + f": the schedule ends with the run, but each optimizer step takes "
                        f"the learning rate {ratio:.3g} scheduler steps on, where the large "
                        "batch steps the same scheduler once: its warm-up and milestones "
                        f"come {ratio:.3g}x sooner in optimizer steps",
                        title_="the LR scheduler steps per micro-step (its horizon counted "
                               "in micro-steps)",
                        fix="Step the scheduler once per optimizer step and count its horizon, "
                            "warm-up and milestones in optimizer steps (micro-batches / K).")]
    return _mid_window_scheduler(rank, events, windows or [])


def _mid_window_scheduler(rank: int, events: list[JsonObject], windows: list[StepWindow]
                          ) -> list[Finding]:
    """F4: a scheduler stepped once per window, but between two backwards of it, before the
    window's optimizer step (DeepSpeed's ``is_gradient_accumulation_boundary()`` asked after
    ``engine.step()``, which already counted the micro-step: true one micro-step early). Each
    update then uses the rate the schedule gives the next optimizer step. No loop without
    accumulation has such a place (a scheduler stepped just before the optimizer, after the
    last backward, is the large batch's own order and is not judged); an error when the rate
    did change between the window's backwards."""
    by_step = {int(w.step): w for w in windows}
    for sid in dict.fromkeys(e.get("sid") for e in events):
        mine = [e for e in events if e.get("sid") == sid and not e.get("in_step")]
        if len(mine) < 2:
            continue
        rows = [(e, by_step.get(int(e["step"]))) for e in mine]
        if any(w is None or not 1 <= int(e["micro"]) < int(w.backwards)
               or int(e["count"]) != int(e["optimizer_steps"]) + 1 for e, w in rows):
            continue
        moved = [w for _, w in rows if w is not None and int(w.lr_changes or 0)]
        if not moved:
            continue
        e, w = rows[0]
        assert w is not None
        return [_mk("F4", "error", rank, int(e["step"]), int(e["micro"]) - 1,
                    f"the LR scheduler stepped once per window, but after {e['micro']} of the "
                    f"window's {w.backwards} backward passes, before its optimizer step, in "
                    f"all {len(mine)} windows it stepped (the rate changed between backwards "
                    f"in {len(moved)} of them): each optimizer step used the rate the schedule "
                    "gives the next one, where the large batch steps the scheduler after its "
                    "update (with DeepSpeed, `is_gradient_accumulation_boundary()` asked after "
                    "`engine.step()` is true one micro-step early)",
                    title_="the LR scheduler steps inside the window, before the optimizer "
                           "step: every update uses the next step's rate",
                    fix="Step the scheduler right after the optimizer step that closes the "
                        "window; with DeepSpeed, read is_gradient_accumulation_boundary() "
                        "before engine.step() (or hand the scheduler to deepspeed.initialize).")]
    return []


def _scaled_clip_finding(rank: int, w: StepRecord) -> Finding | None:
    """F8: ``clip_grad_norm_`` before ``GradScaler.unscale_`` measured the gradient times the
    loss scale S. When that norm exceeded max_norm the clip shrank the gradient to
    max_norm / S of the unscaled one, where the large batch's update is clipped at max_norm
    (or not at all): the update differs. A clip that did not bite changed nothing."""
    if not w.clip_before_unscale:
        return None
    scale, norm, limit = w.clip_before_unscale[:3]
    if not norm > limit * (1 + 1e-6) or scale == 1.0:
        return None
    if len(w.clip_before_unscale) >= 5:
        scaled, total = (int(x) for x in w.clip_before_unscale[3:5])
        return _mk("F8", "error", rank, w.step, None,
                   f"clip_grad_norm_ at optimizer step {_n(w.step)} ran after "
                   f"GradScaler.unscale_ of one optimizer but not of another sharing the "
                   f"scaler: {scaled} of the {total} parameters it clipped still held their "
                   f"gradient times the loss scale {scale:g}, so the norm it measured "
                   f"({norm:.4g} against max_norm {limit:g}) was set by scaled gradients and "
                   "the clip shrank every gradient by a factor the unscaled window's norm "
                   "would not give",
                   title_="gradients clipped while one optimizer's were still scaled",
                   fix="Call scaler.unscale_(opt) for every optimizer the clip covers before "
                       "clip_grad_norm_ (GradScaler.step then skips the unscale it already "
                       "did).")
    true = norm / scale
    meant = (f"clipped at {limit:g}" if true > limit else f"left as it was (norm {true:.4g} "
             f"< {limit:g})")
    return _mk("F8", "error", rank, w.step, None,
               f"clip_grad_norm_ ran before GradScaler.unscale_ at optimizer step "
               f"{_n(w.step)}: it measured the gradient times the loss scale {scale:g} "
               f"(norm {norm:.4g}) against max_norm {limit:g}, so the unscaled gradient "
               f"reached the optimizer with norm {limit / scale:.3g}, where it should have "
               f"been {meant}")
