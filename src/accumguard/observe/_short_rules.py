"""Windows shorter than K, judged by what surrounds them (split from :mod:`.rules`).

The decision is :func:`accumguard.observe._shared_rules.short_window`, the one the runtime
guard makes when the window after a short one closes; here it is folded over a finished
run's windows: the first window short and the next whole (F13, the counter's origin), a
step in the middle of a pass over the DataLoader (F13, the boundary off), windows of one
backward in a row that the run-wide F1 rule (:func:`accumguard.observe._size_rules._f1`) does not
cover. An epoch's last window, the run's last one and a resumed run's first window (it
began on the restored gradient of a saved partial window) are right.

No torch here, as in :mod:`.rules`.
"""

from __future__ import annotations

import dataclasses

from accumguard.observe import _shared_rules as shared
from accumguard.observe._divisor_rules import divided_for_other_size
from accumguard.observe._records import Finding, KResolution, Severity, StepWindow, _mk, _n
from accumguard.observe._weight_rules import sized_on_purpose

__all__ = ["continued_windows", "own_size_title", "reborn", "short_window_findings", "stale_finding"]


def reborn(windows: list[StepWindow], i: int) -> bool:
    """Window ``i`` is the first of an optimizer made after an abandoned model's backwards
    (a run rebuilt to resume in the same process: :attr:`StepRecord.unborn`)."""
    w = windows[i]
    return i > 0 and w.unborn > 0 and w.opt_serial not in {x.opt_serial for x in windows[:i]}


def resumed_long(rank: int, windows: list[StepWindow], w: StepWindow, k: int | None
                 ) -> Finding | None:
    """F13 for the first window of an optimizer made after ``w.unborn`` backward passes of
    an abandoned model (a run rebuilt to resume in the same process), whose first backward
    found the saved partial window's gradient restored in ``.grad`` and which then ran K
    backward passes of its own: the resume restored the gradient but restarted the window's
    counter, so one update holds ``unborn + K`` micro-batches; None otherwise."""
    i = next((j for j, x in enumerate(windows) if x is w), None)
    if k is None or k < 2 or i is None or not reborn(windows, i) or not w.began_on_grad \
            or w.window != k:
        return None
    return _mk("F13", "error", rank, w.step, None,
               f"an optimizer made after {w.unborn} backward pass(es) of an earlier model (a "
               "run rebuilt to resume) found a gradient already in .grad at its first "
               f"backward (a restored partial window), then ran K = {k} backward passes of its "
               f"own before its first step: that update holds K micro-batches on top of the "
               f"restored ones ({w.unborn} ran before the resume), not {k}. The resume restored "
               "the saved window's gradient but started the window's micro-step counter over "
               "(or from the step count) instead of restoring it",
               title_="a resumed window runs K more micro-steps on top of the restored partial "
                      "window: the micro-step counter was not restored",
               fix="Save the micro-step counter with the checkpoint and restore it, so the "
                   "resumed window runs only the micro-steps the saved one still lacked.")


def stale_finding(rank: int, windows: list[StepWindow], w: StepWindow, k: int | None
                  ) -> Finding:
    """A window whose optimizer received gradient left from before its first backward (the
    conservation verdict "stale"): F13 for a resumed window run K more micro-steps on top of
    the restored partial one (:func:`resumed_long`), else F7, a gradient never cleared."""
    cons = w.conservation
    return resumed_long(rank, windows, w, k) or _mk(
        "F7", "error", rank, w.step, 0,
        f"gradient left from before this window (relative size "
        f"{cons.stale if cons is not None else 0.0:.3g}) reached optimizer step {_n(w.step)}: "
        "gradients were not cleared after the previous step",
        title_="gradient not cleared after an optimizer step: an earlier window's gradient "
               "reached this one",
        fix="Clear the gradients of every parameter an optimizer steps once per window, after "
            "its step (zero_grad() on each optimizer, or on the model when one optimizer holds "
            "only some of its parameters).")


def _later_optimizer(w: StepWindow) -> bool:
    """``w`` is the first window judged of an optimizer object that is not the run's first
    (its serial is above 1, and another optimizer stepped before it): the first window of a
    trainer rebuilt to resume, when each optimizer is judged on its own windows."""
    return w.step > 0 and w.opt_serial is not None and w.opt_serial > 1


def continued_windows(windows: list[StepWindow], k: int | None) -> list[StepWindow]:
    """The windows that continue a saved partial window (a resumed run that restored the
    gradient it saved): fewer than K backward passes and a gradient already in ``.grad``
    before the first one (the conservation verdict's "stale" part). The run's first
    optimizer step (step 0), the first window of an optimizer rebuilt to resume
    (:func:`reborn`), or a later optimizer's first (:func:`_later_optimizer`): the callbacks judge each window on its own, and any other window that
    began on a gradient is a leak (F7)."""
    if not windows or k is None or k < 2:
        return []
    out = []
    for i, w in enumerate(windows):
        if not (i == 0 and (w.step == 0 or _later_optimizer(w))) and not reborn(windows, i):
            continue
        cons = w.conservation
        stale = (cons is not None and cons.reason == "stale") or bool(w.began_on_grad)
        if shared.continues_saved_window(w.window, k, first=True, stale=stale):
            out.append(w)
    return out


def short_window_findings(rank: int, windows: list[StepWindow], res: KResolution,
                          *, f1_found: bool) -> list[Finding]:
    """One finding per class for the run's short windows (``f1_found``: the run-wide F1
    rule already spoke). A window longer than K anywhere means the loop sizes its windows
    (a token budget): then the short ones are sizes too, judged by the window-size rules."""
    k = res.k
    windows = [w for w in windows if w.window]
    if k is None or k <= 1 or not windows or any(w.window > k for w in windows):
        return []
    passes = any(w.data_pass_starts for w in windows)
    continued = continued_windows(windows, k)
    out: list[Finding] = []
    said: set[str] = set()
    serials = [w.opt_serial for w in windows]
    for i, w in enumerate(windows):
        n = w.window
        if not shared.early_step(n, k, w.forwards or ()):
            continue
        nxt = windows[i + 1] if i + 1 < len(windows) else None
        if nxt is not None and serials[i] is not None and serials[i] not in serials[i + 1:]:
            # its optimizer never stepped again (another optimizer object took over: a
            # large-batch reference run after the training, a second phase): its last window
            nxt = None
        ends = (0 in (nxt.data_pass_starts or [])) if nxt is not None and passes else (
            False if passes else None)
        # the first window of an optimizer made after an abandoned model's backwards (a run
        # rebuilt to resume): its origin is judged as the run's first window's
        # or the first window of any optimizer object made after another one stepped (a
        # run rebuilt from a checkpoint after the first stopped at a step): its origin too
        fresh = i > 0 and serials[i] is not None and serials[i] not in serials[:i]
        again = reborn(windows, i) or fresh
        verdict = shared.short_window(n, k, first=i == 0 or again,
                                      nxt=None if nxt is None else nxt.window,
                                      last=nxt is None, ends_pass=ends,
                                      continued=any(w is c for c in continued))
        if again and verdict == "F13" and _periodic_tail(windows, i, k):
            continue  # the pass's own short tail, where the run before the resume had its own
        if again and verdict == "F13" and nxt is not None and nxt.window == k \
                and nxt.opt_serial == w.opt_serial:
            if "F13" not in said:
                said.add("F13")
                out.append(_resumed_short(rank, windows, i, k, res) if w.unborn > 0
                           else _rebuilt_short(rank, windows, i, k, res))
            continue
        if again and fresh and not reborn(windows, i):
            continue  # (a new optimizer's first window is judged above, or not at all)
        if again and verdict == "F1":
            continue  # (a tail left by the abandoned run: not this optimizer's cadence)
        if i == 0 and _later_optimizer(w) and w.began_on_grad and verdict == "F13":
            continue  # its first backward found a gradient there: a restored partial window
        if i == 0 and _later_optimizer(w) and w.conservation is None and verdict == "F13" \
                and (nxt is None or nxt.window < k):
            # an optimizer's first window, another optimizer having stepped before it (a
            # run rebuilt to resume), the gradient it began on unmeasured and no whole
            # window after it: it may continue a saved partial window; nothing proves the
            # counter off
            continue
        if verdict in ("F1", "F13") and verdict not in said:
            f = _finding(rank, verdict, i, windows, res, passes, f1_found)
            if f is not None and i == 0 and _later_optimizer(w) and w.conservation is None \
                    and w.began_on_grad is None and f.cls == "F13" and f.severity == "error":
                # a run rebuilt to resume whose first window's gradient before its first
                # backward was not read: a restored partial window and a counter off by the
                # missing micro-steps look alike, nothing proves which
                f = dataclasses.replace(
                    f, severity=Severity.WARNING,
                    evidence=f.evidence + "; this optimizer was made after another one had "
                    "stepped (a run rebuilt to resume) and the gradient its first window "
                    "began on was not measured: if the resume restored the saved window's "
                    "gradient into .grad, this window is right")
            if f is not None:
                said.add(verdict)
                out.append(f)
    return out


def _resumed_short(rank: int, windows: list[StepWindow], i: int, k: int,
                   res: KResolution) -> Finding:
    w = windows[i]
    # a DeepSpeed engine keeps the window's gradient in its own buffers, which its
    # checkpoints do not hold: a rebuilt engine's first window starts on no gradient
    deepspeed = w.source == "deepspeed"
    measured = w.began_on_grad is False or deepspeed
    return _mk("F13", _restart_level(windows, i, k, res) if measured else "warning",
               rank, w.step, w.window - 1,
               f"an optimizer made after {w.unborn} backward pass(es) whose gradient it does "
               "not hold (its parameters held none when it was made: a run rebuilt to resume) "
               f"made its first step after {w.window} backward pass(es) of its own, the next "
               f"after {windows[i + 1].window} (K = {k}), "
               + ("with no gradient in .grad before them: the resume began mid-window without "
                  "the saved window's gradient, so "
                  f"{k - w.window} micro-batch(es) of that window are missing from its update"
                  if measured else
                  "and whether .grad held a gradient at its first backward was not measured: "
                  "if the resume restored the saved window's gradient, this window is right; "
                  f"if not, {k - w.window} micro-batch(es) of that window are missing from "
                  "its update"),
               title_="a resumed run's first window is short",
               fix="On resume, restart the window: rewind the data to the window's first "
                   "micro-batch (checkpoints taken mid-window hold no gradient), or save the "
                   "partial gradient with the checkpoint and restore it into .grad")


def _periodic_tail(windows: list[StepWindow], i: int, k: int) -> bool:
    """Window ``i`` (a rebuilt run's first) is one of the run's short windows of one size
    that recur at one period, at least one of them before it, every other window K: the
    short tail of each pass over the data (10 micro-batches in windows of 4, 4, 2), which
    the resume reached exactly where the run without it would have, not a counter off."""
    shorts = [j for j, w in enumerate(windows) if w.window < k]
    if i not in shorts or shorts[0] >= i or len(shorts) < 2:
        return False
    if len({windows[j].window for j in shorts}) != 1 or any(
            w.window != k for j, w in enumerate(windows) if j not in shorts and j != len(windows) - 1):
        return False
    return len({b - a for a, b in zip(shorts, shorts[1:], strict=False)}) == 1


def _restart_level(windows: list[StepWindow], i: int, k: int, res: KResolution) -> str:
    """An error when K was declared, or the run's other windows are steadily K: the same
    optimizer's later ones with those of the optimizers before the rebuild (the run before
    the resume) — at least two, most of them K, none longer; a warning otherwise."""
    serial = windows[i].opt_serial
    later = [x.window for x in windows[i + 1:] if x.opt_serial == serial]
    before = [x.window for x in windows[:i] if x.opt_serial != serial]
    rest = later + before
    steady = bool(later) and len(rest) >= 2 and all(m <= k for m in rest) \
        and 2 * rest.count(k) >= len(rest)
    return "error" if res.declared or steady else "warning"


def _rebuilt_short(rank: int, windows: list[StepWindow], i: int, k: int,
                   res: KResolution) -> Finding:
    """The first window of an optimizer object made after another one's last step (a run
    rebuilt from a checkpoint) is short while its next ones hold K: the windows after the
    rebuild are shifted, a counter restored off the window boundary."""
    w = windows[i]
    # a DeepSpeed engine keeps the window's gradient in its own buffers, which its
    # checkpoints do not hold: a rebuilt engine's first window starts on no gradient
    deepspeed = w.source == "deepspeed"
    measured = w.began_on_grad is False or deepspeed
    return _mk("F13", _restart_level(windows, i, k, res) if measured else "warning",
               rank, w.step, w.window - 1,
               f"a new optimizer object (made after the previous one's last step: a run "
               f"rebuilt from a checkpoint) made its first step after {w.window} backward "
               f"pass(es), then after {windows[i + 1].window} (K = {k}): its first window "
               f"held {w.window} of K micro-batches"
               + (" and the DeepSpeed engine it was rebuilt into started it on no gradient "
                  "(a DeepSpeed checkpoint holds no partly accumulated gradient: the engine "
                  "keeps it in buffers save_checkpoint does not write), so the micro-batches "
                  "of the saved window's first part are lost and the window boundaries after "
                  "the rebuild are shifted (a checkpoint saved in the middle of a window)"
                  if deepspeed else
                  " and .grad held no gradient at its first backward, so the window "
                  "boundaries after the rebuild are shifted; the counter that decides the "
                  "boundary was restored off by the missing micro-steps (a counter saved "
                  "before its increment, or a resume in the middle of a window)"
                  if measured else
                  "; whether .grad held a gradient at its first backward was not measured: "
                  "if the resume restored the saved window's gradient, this window is right; "
                  "if not, the counter that decides the boundary was restored off by the "
                  "missing micro-steps"),
               title_="accumulation counter off after a resume: the first window is short",
               fix="Save and restore the micro-step counter at the window boundary (after its "
                   "increment), so the resumed run's first window holds K micro-batches")


def own_size_title(n: int, k: int) -> str:
    """The title of windows of another size than K, each normalised to its own size."""
    return (f"windows of {n} micro-steps where K = {k}, each normalised to its own size: a "
            "window size the loop chose, or a boundary off")


def _finding(rank: int, verdict: str, i: int, windows: list[StepWindow], res: KResolution,
             passes: bool, f1_found: bool) -> Finding | None:
    k = res.k
    assert k is not None
    w = windows[i]
    n, step = w.window, w.step
    sev = "error" if res.declared else "note"
    if verdict == "F1":
        if f1_found:
            return None
        return _mk("F1", "error" if res.strength in ("flag", "runtime") else "note", rank,
                   step, 0, f"optimizer steps {_n(step)} and the one next to it each came after "
                   f"a single backward pass (K = {k}, {res.source}), not at the end of a "
                   "pass over the data nor of the run: the loop steps every micro-step there")
    if i == 0:
        scaled = divided_for_other_size(rank, windows, k)
        if scaled is not None:
            return scaled
        rest = [x.window for x in windows[1:]]
        steady = all(m <= k for m in rest) and 2 * rest.count(k) >= len(rest)
        own = sized_on_purpose([x for x in windows if x.window == n],
                               [x for x in windows if x.window == k])
        if not own and 1 < n < k - 1 and len(windows) >= 3 \
                and all(x.window == n for x in windows):
            # every window the same size below K - 1: the loop's boundary comes every n
            # micro-steps (two accumulate() contexts advancing one counter, a K halved), not
            # a counter off by one (K - 1: F13 below)
            return _mk("F1", sev, rank, step, n - 1,
                       f"every one of the {len(windows)} optimizer steps came after {n} "
                       f"backward passes where K = {k} ({res.source}): the optimizer steps "
                       f"every {n} micro-steps, {k // n if k % n == 0 else k / n:.3g} times as "
                       "often as the accumulation asks, each step on a window of "
                       f"{n} micro-batches",
                       title_=f"the optimizer steps every {n} micro-steps where K = {k}",
                       fix="Let one boundary decide the step, counted once per micro-step "
                           "(Accelerate: one `accumulate(model_a, model_b)` for several "
                           "models, not nested `accumulate()` contexts, each of which "
                           "advances the step counter)")
        return _mk("F13", "note" if own else "error" if res.declared or (
                   len(windows) >= 3 and steady) else "note", rank, step, n - 1,
                   f"the first optimizer step came after {n} backward pass(es), the next after "
                   f"{windows[1].window} (K = {k}): the boundary test counts from the wrong "
                   "origin (e.g. `i % K == 0` with i from 0), or a resumed run did not restore "
                   "the saved window's gradient; only the last window of an epoch or run may "
                   "be short" + (own or ""),
                   title_=own_size_title(n, k) if own else None)
    if not passes:
        return None
    return _mk("F13", sev, rank, step, n - 1,
               f"optimizer step {_n(step)} came after {n} of K = {k} backward passes in the "
               "middle of a pass over the DataLoader (the pass went on after it; not an "
               "epoch's last window): the boundary is off (a counter reset or shifted), so "
               "this window and the large batch differ")
