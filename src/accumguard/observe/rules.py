"""The per-window rules: from recorded optimizer steps to findings (pure Python).

The ONE place that knows what a window of step records means. ``accumguard watch``
(:mod:`accumguard.watch._findings`) applies :func:`analyze` to the per-rank recordings
after the run; the framework callbacks (:mod:`accumguard.integrations`) apply
:func:`live_findings` to each :class:`~accumguard.observe.StepEvent` as it happens. Both
read a step as the dict :func:`step_record` makes of it (a line of ``rank-<R>.jsonl``).

Each finding names a failure class of :mod:`accumguard.core.taxonomy`, the rank, the
optimizer step and micro-step, the evidence and the fix. Severity is honest: an
``error`` names a mathematical difference in what the optimizer receives; a wasteful
pattern (syncing every micro-step, ``no_sync`` spanning only the backward) is an
``EXTRA_SYNC`` note titled by its measured cost, never a "correct" verdict (another rule
may find an error on the same step).

No torch here: the watch CLI analyses recordings without importing it. The boundary and window-shape rules live here; the rules that read weights and scales
(token weights, the loss record, LOSS_SCALE, F7/F1 from the window's scale, F10) live
in :mod:`._weight_rules`, F12 in :mod:`._precision_rules`, what a finding and a window are in :mod:`._records`; this
module runs them all and re-exports their public names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from accumguard.core.window import Conservation, StepRecord
from accumguard.observe import _shared_rules as shared
from accumguard.observe._accelerate_rules import tail_scaled_but_carried
from accumguard.observe._cadence_rules import double_gate_findings, never_stepped_findings
from accumguard.observe._comm_rules import (
    coalesced_flush_findings,
    collectives_before,
    comm_findings,
    resummed_findings,
)
from accumguard.observe._divisor_rules import mixed_window_findings
from accumguard.observe._ds_plain_rules import plain_penalty_findings
from accumguard.observe._epochs import (
    dropped_finding,
    dropped_tail,
    scheduled_tail_findings,
    short_epoch_findings,
)
from accumguard.observe._framework_fixes import framework_fixes, frameworks
from accumguard.observe._grad_hook_rules import grad_rescale_findings
from accumguard.observe._groups import after_in_backward, group_ks, optimizer_groups
from accumguard.observe._hook_factor import fill_hook_factors, hook_k_findings, hook_sum_findings
from accumguard.observe._hook_step_rules import in_backward_findings
from accumguard.observe._isolated import Isolated
from accumguard.observe._k_resolution import resolve_k, spans_passes
from accumguard.observe._ledger import ledger_findings, weights_right
from accumguard.observe._lr_rules import lr_schedule_findings
from accumguard.observe._partial_window_rules import partial_window_findings
from accumguard.observe._precision_rules import (
    F12_ERROR_FACTOR,
    f12_drift,
    low_precision_findings,
    pair_master_sums,
)
from accumguard.observe._rank_rules import (
    averaged_inside_steps,
    clipped_apart_findings,
    cross_rank_findings,
    joined_rank_findings,
    manual_reduce_findings,
    rank_scale_findings,
    received_alike_steps,
)
from accumguard.observe._records import (
    NUMBERING,
    DeclaredK,
    Finding,
    JsonObject,
    KResolution,
    RunRecording,
    Severity,
    StepLike,
    StepWindow,
    _mk,
    _n,
    _windows,
    load_recordings,
    records,
    step_record,
    watch_dict,
    windows,
)
from accumguard.observe._scale_rules import loss_scale_findings
from accumguard.observe._schedules import explained_by_f1, run_horizon_findings
from accumguard.observe._shared_rules import conservation_class as _conservation_class
from accumguard.observe._shared_rules import double_gating, engine_resets
from accumguard.observe._short_rules import (
    continued_windows,
    stale_finding,
)
from accumguard.observe._size_rules import window_findings
from accumguard.observe._step_rules import (
    UNREDUCED,
    _extra_step,
    _no_update,
    _scaled_clip_finding,
    _scheduler_findings,
    _sync_findings,
    _two_pass,
)
from accumguard.observe._term_ledger import term_findings
from accumguard.observe._weight_rules import (
    WEIGHT_TOL,
    WEIGHT_TOL_LOW_PRECISION,
    classify_token_weights,
    grad_step_findings,
    loss_weight_findings,
)
from accumguard.observe._wipe_rules import wipe_finding
from accumguard.observe._zero3_rules import zero3_overwrite_findings

__all__ = ["F12_ERROR_FACTOR", "NUMBERING", "WEIGHT_TOL", "WEIGHT_TOL_LOW_PRECISION", "DeclaredK", "Finding",
           "KResolution", "RunRecording", "Severity", "analyze", "classify_token_weights",
           "conservation_class", "f12_drift", "grad_step_findings", "live_findings", "load_recordings",
           "loss_scale_findings", "loss_weight_findings", "mixed_window_findings",
           "partial_window_findings",
           "low_precision_findings", "manual_reduce_findings", "rank_scale_findings",
           "resolve_k", "step_record", "watch_dict", "windows"]



def conservation_class(cons: Conservation | Mapping[str, object], zero_grads_between: int
                       ) -> str:
    """The class of a broken conservation verdict: gradient left from the previous window
    (F7), removed by a ``zero_grad`` inside the window (F3), or removed by something else
    between backwards (F2/F3: an engine reset or a hand-written clear)."""
    given = cons.reason if isinstance(cons, Conservation) else cons.get("reason")
    reason = given if isinstance(given, str) else None
    return _conservation_class(reason, zero_grad_inside=bool(zero_grads_between))


def live_findings(record: StepLike, *, rank: int | None, k: int | None
                  ) -> list[Finding]:
    """The rules that one window decides on its own, applied as the step happens (the
    framework callbacks): conservation (F7/F3/F2/F3), clipping inside the window (F8),
    the last micro-step's sync flag (F11; wasteful syncs are notes), DeepSpeed double
    gating (F14) and boundary resets (F2), low-precision accumulation (F12), and a window
    longer than the declared K (F13, or F7 when it crossed into a new DataLoader pass).
    Rules that need the whole run (F1, F13 origin, F4 counts, cross-rank F11): :func:`analyze`."""
    ws = _windows([record])
    if not ws:
        return []
    w = ws[0]
    out = _rank_findings(rank if rank is not None else 0, ws, {}, k, True)
    # F12 is one window's own fact (the dtype its gradient was summed in): the callbacks too
    out += [f for f in low_precision_findings(rank, ws) if f.severity != "note"]
    if rank is None:
        out = [Finding(f.cls, f.severity, None, f.step, f.micro, f.evidence, f.fix, f.title)
               for f in out]
    n = w.window
    if k is not None and k > 1 and n and shared.overrun(n - 1, k):
        leak = spans_passes(w)
        out.append(_mk(shared.long_window_class(leak), "error", rank, w.step, n - 1,
                       f"{n} backward passes before one optimizer step (K = {k})"
                       + (": micro-steps left at the end of a pass over the DataLoader "
                          "leaked into the next pass's window" if leak else
                          f": the boundary comes {n - k} micro-step(s) late")))
    return out


def analyze(rec: RunRecording, *, k_flag: int | None = None, script: DeclaredK | None = None
            ) -> tuple[list[Finding], int | None, str]:
    """All findings of the run, K and where K came from. ``script``: the K the command's
    script declares (:func:`accumguard.watch._declared.declared_k`).

    Each rule runs on its own (:class:`._isolated.Isolated`): one that raises (accumguard's own bug, met on a recording no
    test had) is noted in ``rec.judge_failures`` with its traceback and the others still
    report, so a report never loses what the working rules found, and never reads as a
    pass for what the failed rule would have judged."""
    res = resolve_k(rec, k_flag, script)
    rule = Isolated(rec)
    findings: list[Finding] = []
    # a DDP comm hook's factor over the ranks, measured, where the engine's could not be read
    rule("fill_hook_factors", fill_hook_factors, rec, default=0)
    # the master-weight copy of a bf16 sum, confirmed over the ranks after a hand all-reduce
    rule("pair_master_sums", pair_master_sums, rec, default=0)
    # the whole update weighs its tokens as the large batch does, across the ranks: a rank's
    # own total of 1/K or K (its share of the 1, with unequal counts) proves nothing
    right = rule("weights_right", weights_right, rec, default=False)
    no_steps: set[int] = set()
    averaged = frozenset(rule("averaged_inside_steps", averaged_inside_steps, rec,
                              default=no_steps))
    for rank in rec.ranks:
        info = rec.engine.get(rank, {})
        lines = rec.steps.get(rank, [])
        groups = rule("optimizer_groups", optimizer_groups, lines)
        none_before: dict[int, set[int]] = {}
        before = rule("collectives_before", collectives_before, lines, default=none_before)
        later = rule("after_in_backward", after_in_backward, lines, res,
                     rec.in_backward_passes.get(rank),
                     int((rec.end.get(rank) or {}).get("backwards_total") or 0))
        for idx, group, gres, note in (later or rule("group_ks", group_ks, groups, res)):
            steps = records(group)
            ws = _windows(steps)
            found: list[Finding] = rule("rank_findings", _rank_findings, rank, steps, info,
                                        gres.k, gres.declared, before, averaged)
            found += rule("window_findings", window_findings, rank, ws, info, gres,
                          rec.end.get(rank, {}).get("k_changes"),
                          int(rec.end.get(rank, {}).get("pending_backwards") or 0))
            found += rule("no_update", _no_update, rank, steps)
            found += rule("two_pass", _two_pass, rank, steps)
            found += rule("zero3_overwrite_findings", zero3_overwrite_findings, rank, ws, info)
            found += rule("loss_weight_findings", loss_weight_findings, rank, ws, rec.world)
            found += rule("mixed_window_findings", mixed_window_findings, rank, ws, gres.k)
            if not right:
                found += rule("loss_scale_findings", loss_scale_findings, rank, ws, gres.k,
                              rec.world)
            found += rule("rank_scale_findings", rank_scale_findings, rank, ws, rec.world)
            found += rule("low_precision_findings", low_precision_findings, rank, ws)
            found += rule("partial_window_findings", partial_window_findings, rank, ws,
                          gres.k, rec.end.get(rank, {}).get("state_loads"))
            found += rule("grad_step_findings", grad_step_findings, rank, ws, gres)
            found += rule("grad_rescale_findings", grad_rescale_findings, rank, ws)
            found += rule("plain_penalty_findings", plain_penalty_findings, rank, ws,
                          info.get("gradient_accumulation_steps"))
            found += rule("short_epoch_findings", short_epoch_findings, rank, ws, gres.k,
                          gres.declared, gres.source)
            if gres.k is not None and (carried := rule(
                    "tail_scaled_but_carried", tail_scaled_but_carried, rank, ws, gres.k, gres,
                    default=None)) is not None:
                # (its windows' micro-steps normalised for two sizes are this tail, carried:
                # the mixed-window F13 would name the same cause twice)
                found = [f for f in found if f.cls != "F13" or "different window sizes"
                         not in f.title]
                found.append(carried)
            if rec.end.get(rank, {}).get("accelerate_unprepared"):
                found += rule("unprepared_pass_findings", unprepared_pass_findings, rank, ws,
                              gres.k)
            if changes := rec.end.get(rank, {}).get("k_changes"):
                found += rule("scheduled_tail_findings", scheduled_tail_findings, rank, ws,
                              changes, rec.end.get(rank, {}).get("k_changes_by")
                              or "Lightning's GradientAccumulationScheduler")
            # the collective ledger (EXTRA_SYNC)
            found = rule("comm_findings", comm_findings, rank, group, found, default=found)
            found += rule("coalesced_flush_findings", coalesced_flush_findings, rank, group)
            if again := rule("resummed_findings", resummed_findings, rank, group, rec.world):
                # (EXTRA_SYNC's "what each call reduced is not recorded": it was, and it is
                # the error)
                found = [f for f in found if f.cls != "EXTRA_SYNC"] + again
            found = rule("double_gate_findings", double_gate_findings, rank, group, found,
                         gres.script if gres.strength == "inferred" else None, default=found)
            if any(f.cls == "F14" for f in found):  # (EXTRA_SYNC's "the same gradient,
                found = [f for f in found if f.cls != "EXTRA_SYNC"]  # a cost only": false)
            if any(f.cls == "F1" and f.severity == "error" for f in found):
                # (F1's note "if it meant to accumulate, pass --accumulation-steps to decide"
                # leaves open what the error proved)
                found = [f for f in found if not (f.cls == "F1" and f.severity == "note")]
            if idx is not None and len(groups) > 1:
                name = next((str(s.optimizer) for s in steps if s.optimizer),
                            "optimizer")
                found = [dataclasses.replace(f, evidence=f"optimizer #{idx} ({name}), judged "
                                             f"on its own window: {f.evidence}")
                         for f in found]
            findings += ([] if note is None else [note._replace(rank)]) + found
        findings += rule("scheduler_findings", _scheduler_findings, rank,
                         rec.schedulers.get(rank, []), _windows(rec.steps.get(rank, [])))
        findings += explained_by_f1(
            rule("run_horizon_findings", run_horizon_findings, rec, rank, res.k), findings, rank)
        if not any(f.cls == "F4" and f.rank == rank for f in findings):
            findings += rule("lr_schedule_findings", lr_schedule_findings, rank,
                             _windows(rec.steps.get(rank, [])), res.k)
    findings += [*rule("cross_rank_findings", cross_rank_findings, rec),
                 *rule("joined_rank_findings", joined_rank_findings, rec)]
    findings += rule("clipped_apart_findings", clipped_apart_findings, rec)
    findings += rule("in_backward_findings", in_backward_findings, rec, res)
    findings += rule("never_stepped_findings", never_stepped_findings, rec)
    ledger = rule("ledger_findings", ledger_findings, rec, res.k)
    if any(f.cls == "F10" and f.severity == "error" for f in ledger):
        # the ledger proved the whole step's weights off by exactly W across ranks: a rank's
        # own LOSS_SCALE guessing another cause would contradict it (a note or warning; an
        # error "K twice" too when K = W: a rank's total of 1/K is then its share, 1/W, of
        # a loss over the ranks' global count, which the ledger read)
        findings = [f for f in findings if f.cls != "LOSS_SCALE"
                    or (f.severity == "error" and res.k != rec.world)]
    if any(f.cls == "F10" and f.title.startswith("FSDP2 on a mesh of one rank")
           for f in findings):
        # FSDP2 reduced over one rank: the ledger's "FSDP2 already averages" is not so
        ledger = [f for f in ledger if f.cls != "LOSS_SCALE"]
    findings += ledger
    hooked = rule("hook_sum_findings", hook_sum_findings, rec) \
        + rule("hook_k_findings", hook_k_findings, rec)
    if hooked:
        # the hook's measured sum explains a total of W: the ledger's note leaving that open
        # would contradict it
        findings = [f for f in findings if f.cls != "LOSS_SCALE" or f.severity == "error"]
    findings += hooked
    if any(f.cls == "LOSS_SCALE" and f.severity == "error" for f in findings):
        # a proven scale error: the notes of the same class that leave the scale open
        # ("not judged", "also what a loss divided by K*W gives") would contradict it
        findings = [f for f in findings if f.cls != "LOSS_SCALE" or f.severity == "error"]
    findings += rule("term_findings", term_findings, rec)
    findings += rule("manual_reduce_findings", manual_reduce_findings, rec)
    alike = rule("received_alike_steps", received_alike_steps, rec, default=set[int]())
    # a sync flag read as off at the window's last forward, yet every rank received the same
    # gradient: the reduction ran (forced in the backward) and the flag's claim is disproved
    findings = [f for f in findings if not (f.cls == "F11" and f.rank is not None
                                            and f.step in alike and UNREDUCED in f.evidence)]
    # one finding per (class, rank) is enough to act on; keep the first
    seen: set[tuple[str, int | None, str]] = set()
    unique = []
    for f in findings:
        key = (f.cls, f.rank, f.severity)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    fixed = rule("framework_fixes", lambda: framework_fixes(unique, frameworks(rec)),
                 default=unique)
    return fixed, res.k, res.source


def _rank_findings(rank: int, steps: Sequence[StepRecord], info: JsonObject,
                   k: int | None, declared: bool,
                   collectives_before: Mapping[int, set[int]] | None = None,
                   averaged: frozenset[int] = frozenset()) -> list[Finding]:
    """``collectives_before``: per optimizer step, the backward passes (0-based) that began
    after a gradient collective of the script's own (the collective ledger); ``averaged``:
    the steps whose reduction inside the window kept every micro-batch of every rank once
    (:func:`._rank_rules.averaged_inside_steps`)."""
    out: list[Finding] = []
    windows = _windows(steps)
    resumed = continued_windows(windows, k)  # their gradient before the first backward: saved
    ds_ga = info.get("gradient_accumulation_steps")
    stage = info.get("zero_stage")
    managed = info.get("managed_accumulation", True)
    for w in windows:
        n = w.window
        step = w.step
        if not n:  # no backward pass since the previous step: judged by what the step did
            out += _extra_step(rank, w)
            continue
        # F14: DeepSpeed accumulates K itself and the loop runs several backwards per step()
        if managed and double_gating(ds_ga, int(w.max_backwards_per_engine_step), n):
            out.append(_mk("F14", "error", rank, step, None,
                           f"DeepSpeed gradient_accumulation_steps={ds_ga} and "
                           f"{w.max_backwards_per_engine_step} backward passes before an "
                           "engine.step() call that was not the engine's accumulation "
                           "boundary (it did not step); the optimizer stepped after "
                           f"{n} backward passes"))
            continue
        # F2: DeepSpeed ZeRO-1/2 reduced-and-reset at a non-final backward of the window
        bounds = w.ds_boundaries or []
        coal = w.ds_coalescing or []
        if n > 1 and len(bounds) == w.backwards:
            early = [j for j, b in enumerate(bounds[:-1])
                     if engine_resets(stage, managed, b, coal[j] if j < len(coal) else False)]
            if early:
                out.append(_mk("F2", "error", rank, step, early[0],
                               f"ZeRO-{stage}: backward passes {[j + 1 for j in early]} of a "
                               f"window of {n} ran at an engine accumulation boundary "
                               f"(gradient_accumulation_steps={ds_ga}); each one resets the "
                               "engine's gradient partition, so only the last micro-batch "
                               "reaches the optimizer"))
                continue
        # F3: engine.zero_grad() between the backwards on ZeRO-0/1, which keep the window's
        # gradient in the parameters' .grad until the boundary (measured: ZeRO-2/3 move it
        # into their partitions inside each backward, and the same clear changes nothing)
        if w.source == "deepspeed" and stage in (0, 1) and managed is not False \
                and n > 1 and int(w.zero_grads_between):
            out.append(_mk("F3", "error", rank, step, None,
                           f"ZeRO-{stage}, gradient_accumulation_steps={ds_ga}: "
                           f"{int(w.zero_grads_between)} zero_grad() call(s) between the "
                           f"{n} backward passes of the window before optimizer step "
                           f"{_n(step)}; ZeRO-{stage} keeps the window's gradient in the "
                           "parameters' .grad until the accumulation boundary, and "
                           "zero_grad() (the engine's, or that of the optimizer "
                           "deepspeed.initialize returned) sets it to None: only the "
                           "micro-batches after the last clear reach the optimizer",
                           title_="zero_grad() inside the window: the micro-batches "
                                  "before it never reach the optimizer",
                           fix="Do not clear inside the window: DeepSpeed clears the "
                               "gradients itself after the step at its boundary (remove the "
                               "engine.zero_grad() or optimizer.zero_grad() call, or make it "
                               "only after a step that stepped)."))
            continue
        cleared = max(w.zero_micros or [0])  # (a clip before a clear: of what it discarded)
        early_clips = [c for c in (w.clip_micros or [])  # (a clip before any: no F8)
                       if shared.clip_verdict(int(c), int(w.backwards)) == "inside"
                       and int(c) > cleared]
        cons = None if any(w is r for r in resumed) else w.conservation
        clipped = bool(early_clips) and not int(w.zero_grads_between)
        if cons and not cons.ok and not (clipped and cons.reason != "stale"):
            # (a clip between backwards shrinks the accumulated gradient: F8 below says so)
            dropped = dropped_tail(w, k)
            if dropped:
                out.append(dropped_finding(rank, w, dropped, k))
            elif cons.reason == "stale":
                out.append(stale_finding(rank, windows, w, k))
            else:
                wiped = wipe_finding(rank, w, n, (collectives_before or {}).get(int(w.step), set()),
                                     int(step) in averaged)
                out += [wiped] if wiped is not None else []
        # F8: clipping before the window's last backward
        if early_clips:
            out.append(_mk("F8", "error", rank, step, early_clips[0] - 1,
                           f"{'/'.join(w.clip_functions or ['gradient clipping'])} "
                           f"ran after backward pass {early_clips[0]} of {w.backwards} in "
                           f"the window ({len(w.clip_micros)} clipping call(s) for one "
                           "optimizer step)"))
        empty = _empty_clip_finding(rank, w)
        if empty is not None and not early_clips:
            out.append(empty)
        unset = _unset_clip_finding(rank, w)
        if unset is not None:
            out.append(unset)
        scaled = _scaled_clip_finding(rank, w)
        if scaled is not None:
            out.append(scaled)
        out += _sync_findings(rank, w)
    ignored = info.get("ignored_accumulation") if info else None
    if ignored and info.get("gradient_accumulation_steps") == 1 and len(steps) >= 2 \
            and all(int(s.backwards) == 1 for s in steps):
        key, asked = ignored
        out.append(_mk("F1", "error", rank, steps[0].step, None,
                       f"the DeepSpeed config asks for an accumulation of {asked} under "
                       f"`{key}`, a key DeepSpeed does not read, and sets neither "
                       "gradient_accumulation_steps nor train_batch_size: the engine ran "
                       "gradient_accumulation_steps = 1, and each of the "
                       f"{len(steps)} optimizer steps observed followed one backward",
                       title_=f"DeepSpeed ignored the accumulation of {asked} the config "
                              "asked for: every engine.step() stepped",
                       fix=f"Name the key `gradient_accumulation_steps` ({key} = {asked} is "
                           "ignored by DeepSpeed)."))
    # F9: DeepSpeed's default clipping active on a run that did not ask for it
    clip = info.get("gradient_clipping")
    if info and clip and not info.get("clipping_set_by_user", True):
        norms = [(s.step, s.grad_norm) for s in steps if s.grad_norm is not None]
        hit = [(st, nm) for st, nm in norms if nm > clip * (1 + 1e-6)]
        if hit:
            out.append(_mk("F9", "error", rank, hit[0][0], None,
                           f"the DeepSpeed config does not set gradient_clipping, the engine "
                           f"clips at {clip:g}, and the gradient norm was {hit[0][1]:.4g} at "
                           f"step {_n(hit[0][0])}: every such update was shrunk"
                           f"{_asked_clip(info.get('requested_clipping'))}"))
        elif norms:
            out.append(_mk("F9", "note", rank, None, None,
                           f"DeepSpeed clips at {clip:g} by default (gradient_clipping not set); "
                           "no step exceeded it in this run"))
    return out


def _empty_clip_finding(rank: int, w: StepWindow) -> Finding | None:
    """F8: every clipping call of the window was given tensors none of which held a gradient
    or required one (``[p.grad.to_local() for p in ...]``, detached copies), and the
    optimizer then stepped on a gradient: the clip read no ``.grad``, so it clipped nothing."""
    empty = w.clip_empty or []
    if not empty or len(empty) != len(w.clip_micros or []) or not w.applied:
        return None
    fn = "/".join(w.clip_functions or ["gradient clipping"])
    tensors = int(empty[0][1])
    return _mk("F8", "error", rank, w.step, None,
               f"{fn} ran {len(empty)} time(s) in the window before optimizer step "
               f"{_n(w.step)}, given {tensors} tensor(s) none of which held a gradient or "
               "required one (not the parameters: e.g. the local shards "
               "`p.grad.to_local()` or detached copies); it reads each tensor's `.grad`, so "
               "it measured a norm of 0 and clipped nothing, and the optimizer stepped on "
               "the unclipped gradient",
               title_="gradient clipping clipped nothing: it was given tensors that hold no "
                      "gradient",
               fix="Pass the parameters themselves (model.parameters()): clip_grad_norm_ "
                   "reads their .grad. On FSDP2, clip_grad_norm_ over the DTensor parameters "
                   "computes the global norm across the shards.")


def _unset_clip_finding(rank: int, w: StepWindow) -> Finding | None:
    """F8: the window's only clipping calls ran before its last backward, on parameters
    that held no gradient then (cleared after the previous step; FSDP2's sharded gradient
    before the synchronising micro-step's backward) and held one at the step: they clipped
    nothing, and the optimizer stepped on the unclipped gradient (a clip in a hook that
    runs at the window's start: HF ``on_step_begin``; a clip placed before the last
    micro-step's backward)."""
    unset = w.clip_unset or []
    n = int(w.backwards)
    if not unset or w.clip_micros or not w.applied or n < 1 \
            or any(int(c) >= n for c in unset):
        return None
    first = all(int(c) == 0 for c in unset)
    where = ("before the first backward pass" if first else
             f"after backward pass(es) {', '.join(str(int(c)) for c in unset)} of {n}, before "
             "the last")
    return _mk("F8", "error", rank, w.step, int(unset[0]),
               f"gradient clipping ran {len(unset)} time(s) {where} of the window of "
               f"optimizer step {_n(w.step)}, on parameters that held no gradient then "
               f"({_unset_why(first, w.engine)}) "
               "and held one at the step; no clipping ran after the window's last backward: "
               "it clipped nothing, and the optimizer stepped on the unclipped gradient",
               title_=("gradient clipping runs before the window's backwards: it clips "
                       "nothing" if first else "gradient clipping runs before the window's "
                       "last backward, on no gradient: it clips nothing"),
               fix="Clip after the window's last backward and before the optimizer step: in "
                   "a plain or FSDP2 loop right before optimizer.step(); in a Hugging Face "
                   "TrainerCallback, on_pre_optimizer_step (not on_step_begin), or "
                   "TrainingArguments(max_grad_norm=...); in Lightning, "
                   "configure_gradient_clipping or Trainer(gradient_clip_val=...).")


def _unset_why(first: bool, engine: str) -> str:
    if first:
        return "cleared after the previous step"
    if engine == "fsdp2":
        return "FSDP2 writes the sharded .grad only at the synchronising micro-step's backward"
    return "not yet written by the window's backwards"


def unprepared_pass_findings(rank: int, windows: list[StepWindow], k: int | None
                             ) -> list[Finding]:
    """F7 under Accelerate: ``accumulate()`` closes a window at the end of a pass over a
    DataLoader it prepared (``sync_with_dataloader``, the default); the loop's backwards ran
    outside any prepared DataLoader (recorded at ``accelerator.backward``), and a window of
    K micro-steps began in one pass over the data and ended in the next: the pass's last
    micro-batches were carried into the next pass's first window."""
    if k is None or k < 2:
        return []
    for w in windows:
        n = int(w.window)
        j = next((int(j) for j in w.data_pass_starts or [] if 0 < int(j) < n), None)
        if j is None or n > k:
            continue  # (a longer window spanning a pass is the leak rule's)
        return [_mk("F7", "error", rank, w.step, j,
                    f"Accelerate accumulated K = {k} micro-steps per window and closes a "
                    "window at the end of a pass over a DataLoader it prepared, but every "
                    "accelerator.backward ran outside any DataLoader accelerator.prepare "
                    f"returned; the window before optimizer step {_n(w.step)} had {j} "
                    f"micro-step(s) from the end of one pass over the data and {n - j} from "
                    "the next: the pass's last micro-batches were not stepped at its end but "
                    "carried into the next pass's first window",
                    title_="an epoch's last micro-batches carried into the next epoch's "
                           "window: Accelerate cannot see where the pass ends",
                    fix="Pass the DataLoader to accelerator.prepare(...) and iterate the one it "
                        "returns: accumulate() then steps on each pass's short last window "
                        "(normalise that window by its own count).")]
    return []


def _asked_clip(asked: float | None) -> str:
    return "" if asked is None else (
        f" (TrainingArguments(max_grad_norm={asked:g}) asked for "
        f"{'no clipping' if asked == 0 else f'clipping at {asked:g}'}; under DeepSpeed the "
        'Trainer leaves clipping to the engine: "gradient_clipping": "auto" in the config '
        "takes max_grad_norm)")
