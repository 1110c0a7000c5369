"""Window sizes against K (pure Python; :mod:`.rules` runs it): F1 (one backward per step
while K > 1 is declared), F13 (a first window shorter than K, windows constantly K-1 / K+1, a
boundary late inside a pass), F7 (a window longer than K among windows of K: leftover
micro-steps of an epoch leaked into the next), and the note on windows of varying size."""

from __future__ import annotations

from collections.abc import Sequence

from accumguard.observe import _shared_rules as shared
from accumguard.observe._accelerate_rules import accelerate_double_gate
from accumguard.observe._epochs import dropped_finding, dropped_tail, scheduled_ks
from accumguard.observe._k_resolution import spans_passes
from accumguard.observe._probe_rules import probe_before_first_window
from accumguard.observe._records import Finding, JsonObject, KResolution, StepWindow, _mk, _n
from accumguard.observe._short_rules import own_size_title, short_window_findings
from accumguard.observe._weight_rules import _firm_k, sized_on_purpose

__all__ = ["window_findings"]


def _synced_as_micro_steps(w: StepWindow, k: int) -> bool:
    """A DDP window of b x K backwards (b >= 2) whose gradient sync was off for all but its
    last b backwards: K micro-steps of b backwards each (an adversarial or perturbed second
    pass per micro-batch, FGM, SAM-style), synced on the last micro-step as a window of K
    micro-steps is, not a boundary b x K late."""
    n = int(w.window)
    flags = list(w.sync_micros or [])
    if k < 1 or n % k or n // k < 2 or len(flags) != n or any(f is None for f in flags):
        return False
    b = n // k
    return flags == [False] * (n - b) + [True] * b


def window_findings(rank: int, windows: list[StepWindow], info: JsonObject,
                     res: KResolution, changes: Sequence[Sequence[int]] | None = None,
                     pending: int = 0) -> list[Finding]:
    """Window sizes against K: F1 (one backward per step while K > 1 is declared), F13
    (a first window shorter than K, or windows constantly K-1 / K+1), F7 (a window longer
    than K among windows of K: leftover micro-steps of an epoch leaked into the next).
    ``changes``: the K a framework set per epoch (Lightning's GradientAccumulationScheduler):
    a window of the K in force when it began is never "longer than K". ``pending``: the
    backward passes the run ended with, never stepped."""
    k = res.k
    out: list[Finding] = []
    windows = [w for w in windows if w.window]  # (no backward: _extra_step)
    if not windows:
        return out
    sizes = [w.window for w in windows]
    ds_ga = info.get("gradient_accumulation_steps")
    out += _f1(rank, windows, res)
    if k is None or k <= 1 or all(n == 1 for n in sizes):
        return out
    if (gated := accelerate_double_gate(rank, windows, k, res)) is not None:
        return [*out, gated]
    sev = "error" if res.declared else "note"
    # windows shorter than K by what surrounds them (the guard's decision, shared): the
    # first one short (the counter's origin), a step inside a pass over the data
    out += short_window_findings(rank, windows, res, f1_found=bool(out))
    engine_ga = isinstance(ds_ga, int) and ds_ga > 1
    own_k = {id(w) for w, sk in zip(windows, scheduled_ks(windows, changes or []), strict=True)
             if sk is not None and w.window == sk}
    long = [w for w in windows if shared.overrun(w.window - 1, k) and id(w) not in own_k
            and not _synced_as_micro_steps(w, k)
            # (F14: gating)
            and not (engine_ga and (w.window == ds_ga
                                    or int(w.max_backwards_per_engine_step) > 1))
            and not (not w.data_pass_starts and (
                dropped_tail(w, k)  # (a part cut off and dropped: its step got K)
                # unchecked, with a zero_grad between its backwards: the clearing may have
                # dropped the extra micro-steps, so the window is not shown to be longer
                or (w.conservation is None and int(w.zero_grads_between or 0) > 0)))]
    regular = sum(1 for n in sizes if n == k)
    if long and any(w.data_pass_starts for w in windows):
        # DataLoader passes were seen: a long window that began in one pass (epoch) and
        # ended in the next is a leak; one inside a single pass is a late boundary
        crossed = [w for w in long if spans_passes(w)]
        if crossed:
            w, n0 = crossed[0], crossed[0].window
            j = next(j for j in w.data_pass_starts if 0 < j < n0)
            unchecked = (w.conservation is None
                         and int(w.zero_grads_between or 0) > 0)
            out.append(dropped_finding(rank, w, j, k) if dropped_tail(w) == j else
                       _mk("F7", "warning", rank, w.step, n0 - 1,
                           f"a window of {n0} backward passes before step {_n(w.step)} "
                           f"spans two DataLoader passes with zero_grad() inside it: the last "
                           f"{j} micro-step(s) of the pass were dropped by it or leaked; the "
                           "window was not checked (sampled out): which one is not claimed",
                           title_="an epoch's partial window dropped or leaked (not checked)")
                       if unchecked else
                       _mk("F7", "error", rank, w.step, n0 - 1,
                           f"a window of {n0} backward passes (K = {k}) before optimizer step "
                           f"{_n(w.step)}: {j} micro-step(s) left at the end of a pass over "
                           "the DataLoader (an epoch) were not stepped and leaked into the "
                           "next epoch's first window"))
        long = [w for w in long if w not in crossed]
        # windows shorter than K too, not at a pass's end: sizes vary (a token budget), the
        # long ones are not a late boundary (the note below says so)
        ends = {i for i, w in enumerate(windows[1:]) if 0 in (w.data_pass_starts or [])}
        varied = any(n < k for i, n in enumerate(sizes[:-1]) if i not in ends)
        if long and varied:
            out.append(_varying_note(rank, long[0], sizes, k, regular))
        elif long:
            n0 = long[0].window
            out.append(_mk("F13", sev, rank, long[0].step, n0 - 1,
                           f"{len(long)} window(s) of {n0} backward passes inside one pass "
                           f"over the data (K = {k}), e.g. before optimizer step "
                           f"{_n(long[0].step)}: the boundary comes {n0 - k} micro-step(s) "
                           "late"))
        long = []
    if long:
        n0 = long[0].window
        constant = len({w.window for w in long}) == 1 and len(long) >= regular
        if constant:
            own = sized_on_purpose(long, [w for w in windows if w.window == k])
            out.append(_mk("F13", "note" if own else sev, rank, long[0].step, n0 - 1,
                           f"{len(long)} window(s) of {n0} backward passes (K = {k}), e.g. "
                           f"before optimizer step {_n(long[0].step)}: the boundary comes "
                           f"{n0 - k} micro-step(s) late" + (own or ""),
                           title_=own_size_title(n0, k) if own else None))
        else:
            # a leak leaves no short window before the last; a loop whose windows vary
            # (a token budget per step) has short ones too: then only a note
            mid_short = any(n < k for n in sizes[:-1])
            # a leak needs an earlier window to leak from, and recurs once per epoch (equal
            # gaps); long windows from the first step on, or at uneven gaps, are a budget
            long_ids = {id(w) for w in long}
            at = [i for i, w in enumerate(windows) if id(w) in long_ids]
            periodic = len({b - a for a, b in zip(at, at[1:], strict=False)}) <= 1
            # with K only inferred and no pass over a DataLoader seen, windows one micro-step
            # longer than the commonest are as likely the loop's real K, the others short by a
            # micro-step the loop skipped (no backward for an empty micro-batch): not a leak
            evidence = (bool(res.declared) or any(w.data_pass_starts for w in windows)
                        or pending == long[0].window - k)  # (the last pass's leftover, never
            # stepped, left pending when the run ended: the same count as each leak)
            leak = (not mid_short and len({w.window for w in long}) == 1
                    and regular > len(long) and at[0] > 0 and periodic and evidence)
            first = windows[at[0]]
            before = windows[at[0] - 1] if at[0] > 0 else None
            cons = first.conservation
            rebuilt = (leak and before is not None and first.opt_serial is not None
                       and before.opt_serial != first.opt_serial
                       and before.opt_serial not in {w.opt_serial for w in windows[at[0]:]}
                       and not (cons and not cons.ok and cons.reason == "stale"))
            if rebuilt:
                # the extra backwards ran after the last step of an optimizer object never
                # seen again (a run interrupted mid-window, then resumed or rebuilt): they
                # may have been the abandoned model's, and no gradient of this one was found
                # left over: a leak is possible, not shown
                out.append(_mk("F7", "warning", rank, first.step, None,
                               f"{n0} backward passes ran between the last step of an "
                               f"optimizer object that never stepped again and optimizer step "
                               f"{_n(first.step)}, the first of a new one (a resume or a "
                               f"rebuilt model), K = {k}: {n0 - k} more than a window. If the "
                               "first of them were the abandoned model's (a run interrupted "
                               "mid-window), the new optimizer's first window is what remains "
                               "(whole, or short if the resume skipped micro-batches); if all "
                               f"were this model's, {n0 - k} leaked into it. Which backward "
                               "reached which model was not measured",
                               title_="backward passes before a rebuilt optimizer's first step"))
            elif leak:
                out.append(_mk("F7", "error", rank, long[0].step, n0 - 1,
                               f"a window of {n0} backward passes before optimizer step "
                               f"{_n(long[0].step)} among {regular} windows of K = {k}: "
                               f"{n0 - k} micro-step(s) left over at the end of an epoch (or "
                               "data pass) were not stepped and leaked into the next window"))
            else:
                out.append(probe_before_first_window(rank, windows, k)
                           or _varying_note(rank, long[0], sizes, k, regular))
    # (a window closing a pass over the data is an epoch's tail, not an off-by-one count)
    short = [w for i, w in enumerate(windows[1:-1], 1) if 1 < w.window < k
             and 0 not in (windows[i + 1].data_pass_starts or [])]
    if res.declared and len(short) >= 2 and all(w.window == k - 1 for w in short) \
            and len(short) >= regular and not any(f.cls == "F13" for f in out):
        out.append(_mk("F13", "error", rank, short[0].step, None,
                       f"{len(short)} windows of {k - 1} backward passes; K = {k}"))
    return out


def _varying_note(rank: int, w: StepWindow, sizes: list[int], k: int, regular: int
                  ) -> Finding:
    """Windows of several sizes, longer and shorter than the most common: a loop that sizes
    each window (a token budget per step) is right; only a fixed K would make it a leak."""
    n0 = w.window
    return _mk("F7", "note", rank, w.step, n0 - 1,
               f"a window of {n0} backward passes before optimizer step {_n(w.step)} "
               f"among {regular} windows of {k} (window sizes {sorted(set(sizes))}): fine "
               "when the loop sizes each window on purpose (a token budget per step) and "
               "normalises by that window's count; if K is fixed, micro-steps leaked into it "
               "from an earlier window",
               title_=f"windows of varying size ({min(sizes)} to {max(sizes)} backward passes "
                      "per optimizer step): right for a token budget, a leak if K is fixed")


def _at_pass_ends(windows: list[StepWindow], ones: list[StepWindow]) -> bool:
    """Every run of single-backward windows ends where a pass over the DataLoader ends (the
    next window starts a pass) or the run ends, and windows of more backwards precede them."""
    idx = {id(w) for w in ones}
    if not any(w.window > 1 for w in windows) or not any(w.data_pass_starts for w in windows):
        return False
    for i, w in enumerate(windows):
        if id(w) in idx and (i + 1 < len(windows) and id(windows[i + 1]) not in idx
                             and 0 not in (windows[i + 1].data_pass_starts or [])):
            return False
    return True


def _f1(rank: int, windows: list[StepWindow], res: KResolution) -> list[Finding]:
    """Step every micro-step: K > 1 declared and (nearly) every window has one backward."""
    k, script = _firm_k(res), res.script
    if k is None or k <= 1:
        return []
    # one backward after K or more forwards (losses summed: the large batch) is not F1
    ones = [w for w in windows if w.window == 1
            and shared.early_step(1, k, w.forwards or ())]
    summed = [w for w in windows if w.window == 1 and w not in ones]
    # nearly every window: epochs whose last window holds one micro-batch are not F1
    if len(ones) < 2 or 4 * len(ones) < 3 * (len(windows) - len(summed)):
        return []
    text = f"{len(ones)} of {len(windows)} optimizer steps came after a single backward pass"
    if _at_pass_ends(windows, ones):
        text += (" (each run of them ends a pass over the DataLoader: from some point of each "
                 "pass every micro-step stepped"
                 + (", as Accelerate does once the prepared loader has yielded its last batch "
                    "(sync_with_dataloader): a window's batches drawn before accumulate() runs "
                    "on them reach that point early" if "accelerate" in res.source else "")
                 + ")")
    if res.strength in ("flag", "runtime"):
        return [_mk("F1", "error", rank, ones[0].step, 0, f"{text}; K = {k} ({res.source})")]
    assert script is not None
    if script.divides_loss and len(ones) >= len(windows) - 1:
        return [_mk("F1", "error", rank, ones[0].step, 0,
                    f"{text}, while the script declares K: {script.describe()}: each step "
                    f"applies one micro-batch's gradient divided by {k}")]
    return [_mk("F1", "note", rank, ones[0].step, 0,
                f"{text}, while the script declares K: {script.describe()}. If it meant to "
                "accumulate, the optimizer steps on every micro-step; pass "
                "--accumulation-steps to decide")]

