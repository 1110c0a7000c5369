"""Epochs read from a rank's step records (pure Python): where each pass over a DataLoader
began, how many backward passes, optimizer steps and scheduler steps each pass held, and
what happened to a pass's last partial window.

The DataLoader patch of the observer notes, in each window, the backward count at which a
new pass began (``data_pass_starts``). From those marks this module rebuilds the passes:
a pass is the backward passes from one mark to the next. The window rules (:mod:`.rules`)
already judge a window that spans two passes (F7: leaked or dropped); here:

* :func:`epochs` - the per-pass counts (also the slack of :mod:`._schedules`);
* :func:`short_epoch_findings` - every pass holds fewer micro-batches than K: each window
  is a pass's short tail, and a loop (or framework) dividing by K weighs each one n/K;
* :func:`scheduled_tail_findings` - K set per epoch by the framework (Lightning's
  ``GradientAccumulationScheduler``): a pass's short last window divided by that epoch's K;
* :func:`dropped_tail` / :func:`dropped_finding` - a pass's partial tail that a
  ``zero_grad()`` at the next pass's start cleared before any step. Dropping it is a
  choice (the large batch with ``drop_last=True``): when the next window is K whole
  micro-steps of the new pass, each step is right and only data was skipped (a warning);
  when it is shorter, that step is short as well (an error, F7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from accumguard.observe._records import (
    Finding,
    JsonObject,
    RunRecording,
    StepLike,
    StepWindow,
    _mk,
    _n,
    _windows,
    records,
)
from accumguard.observe._weight_rules import _f7_mass, _near, _rescaled

__all__ = ["Epoch", "complete_epochs", "dropped_finding", "dropped_tail", "epochs",
           "every_epoch_short", "scheduled_ks", "scheduled_tail_findings", "short_epoch_findings"]


@dataclass(frozen=True)
class Epoch:
    """One pass over a DataLoader as the step records saw it."""

    backwards: int  # backward passes between this pass's start and the next one's
    steps: int  # optimizer steps whose window ended inside this pass
    windows: tuple[int, ...]  # the backward passes of each of those windows
    scheduler_steps: int = 0  # scheduler steps made inside this pass (or at its end)

    def as_dict(self) -> dict[str, int | list[int]]:
        return {"micro_batches": self.backwards, "optimizer_steps": self.steps,
                "scheduler_steps": self.scheduler_steps, "windows": list(self.windows)}


def epochs(steps: Sequence[StepLike],
           schedulers: list[JsonObject] | None = None, pending: int = 0) -> list[Epoch]:
    """The passes over the data seen in the step records, in order (empty: no DataLoader
    pass was seen). Backward passes before the first mark are not a pass (data made by
    hand before the first ``for`` over a DataLoader); the last pass ends at the last step
    (backward passes after it were never stepped). ``schedulers``: the rank's scheduler
    records, counted in the pass where they were made (a step right after a pass's last
    optimizer step belongs to that pass); ``pending``: backward passes after the last step
    (the end record's ``pending_backwards``), counted in the last pass."""
    starts: list[int] = []  # global backward index of each pass start
    ends: list[int] = []  # global backward index after each window's last backward
    before: dict[int, int] = {}  # step index -> backward passes before its window
    total = 0
    for s in records(steps):
        before[s.step] = total
        n = int(s.backwards or 0)
        for j in s.data_pass_starts or []:
            if isinstance(j, int) and 0 <= j <= n:
                starts.append(total + j)
        total += n
        ends.append(total)
    if not starts:
        return []
    at = [before.get(int(e.get("step", 0)), total) + int(e.get("micro", 0))
          for e in schedulers or []]
    out = []
    bounds = [*starts, total + max(0, pending)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        wins = []
        prev = a
        for e in ends:
            if a < e <= b:
                wins.append(e - prev)
                prev = e
        out.append(Epoch(b - a, len(wins), tuple(wins), sum(1 for g in at if a < g <= b)))
    return out


def complete_epochs(steps: Sequence[StepLike], pending: int = 0) -> bool:
    """Whether the run's passes over the data all held the same number of backward passes
    (two or more passes; ``pending``: backward passes after the last step): the run went
    through its last pass to the end, it did not break out of it (a ``max_steps`` cut ends
    a pass early)."""
    eps = epochs(steps, pending=pending)
    return len(eps) >= 2 and len({e.backwards for e in eps}) == 1


def every_epoch_short(windows: list[StepWindow], k: int) -> bool:
    """Two or more optimizer steps, each closing one whole pass over the DataLoader of
    fewer than K micro-batches: every window begins a pass and is shorter than K."""
    ws = [w for w in windows if w.window]
    return len(ws) >= 2 and all(0 in (w.data_pass_starts or []) and w.window < k for w in ws)


def run_epochs_short(rec: RunRecording, k: int) -> bool:
    """:func:`every_epoch_short` on every rank that stepped: such a run's windows cannot
    reach K, so they do not contradict a K the script declares."""
    ranks = [s for s in rec.steps.values() if s]
    return bool(ranks) and all(every_epoch_short(_windows(s), k) for s in ranks)


def short_epoch_findings(rank: int, windows: list[StepWindow], k: int | None,
                         declared: bool, source: str) -> list[Finding]:
    """Every pass over the data held fewer micro-batches than K, and each optimizer step
    closed one whole pass (Lightning steps at an epoch's last batch): an error (F7) when
    K was declared and every window's loss record weighs its tokens n/K in total (each
    short window divided by K instead of its own n: the update is n/K of its mean
    gradient); a note otherwise (the steps are right only if each was normalised by its
    own count, and each is a batch of n, not K, micro-batches)."""
    if k is None or k < 2 or not all(w.window for w in windows) \
            or not every_epoch_short(windows, k):
        return []
    sizes = [w.window for w in windows]
    masses = [_f7_mass(w) for w in windows]
    measured = [(m, n) for m, n in zip(masses, sizes, strict=True) if m is not None]
    uniq = "/".join(map(str, sorted(set(sizes))))
    text = (f"all {len(windows)} optimizer steps came at the end of a pass over the DataLoader "
            f"(an epoch) after {uniq} micro-batch(es), fewer than K = {k} ({source}): every "
            "epoch is shorter than K, so each step closes a short window")
    fix_k = (f"Use K <= the batches per epoch ({min(sizes)}) (Lightning: "
             "accumulate_grad_batches; it divides every batch's loss by it and steps "
             "at the epoch's end), or normalise each window's loss by its own count.")
    why = None
    if declared and measured and all(_near(m.mass, n / k, m.low) for m, n in measured):
        m0, n0 = measured[0]
        why = (f"{m0.words(n0, k)} (measured in {len(measured)} of the {len(windows)} "
               "windows, each n/K): each short window was "
               f"divided by K instead of its own {uniq} micro-batch(es), so every update is "
               f"{uniq}/{k}")
    elif declared and source == "declared by lightning" and all(m is None for m in masses) \
            and not any(_rescaled(w) for w in windows):
        # no loss call recorded (a loss built by hand), but K is the Lightning Trainer's
        # accumulate_grad_batches: its automatic optimisation divides every batch's loss by
        # it (its closure), also in an epoch's last, short window; manual optimisation
        # does not accept accumulate_grad_batches > 1
        why = (f"Lightning's automatic optimisation divides every batch's loss by "
               f"accumulate_grad_batches = {k}, the last window of an epoch too: each short "
               f"window of {uniq} micro-batch(es) is divided by {k}, so every update is "
               f"{uniq}/{k}")
    if why is not None:
        return [_mk("F7", "error", rank, windows[0].step, sizes[0] - 1,
                    f"{text}, and {why} of the window's mean gradient",
                    title_=f"every epoch shorter than K = {k}, and each short window divided "
                           "by K",
                    fix=fix_k)]
    own = bool(measured) and all(_near(m.mass, 1.0, m.low) for m, _ in measured)
    return [_mk("F7", "note", rank, windows[0].step, None,
                f"{text}. " + (f"Each window's loss was normalised by its own count "
                               f"(measured: a total weight of 1 in {len(measured)} of the "
                               f"{len(windows)} windows), so each step is the mean over its "
                               "epoch" if own else
                               "Each step is the mean over its epoch only if its loss was "
                               "normalised by the window's own count")
                + f"; the effective batch is {uniq} micro-batch(es), not {k}",
                title_=f"every epoch shorter than K = {k}: each optimizer step closes a short "
                       "window",
                fix=f"Use K <= the batches per epoch ({min(sizes)}).")]


def dropped_tail(w: StepWindow, k: int | None = None) -> int:
    """Micro-steps at the end of a pass over the DataLoader that a ``zero_grad()`` at the
    start of the next pass cleared before any step (0: not that): the window spans two
    passes and conservation saw the gradient wiped exactly where the new pass began. With
    ``k``, also a window that read no DataLoader whose one ``zero_grad()`` came exactly K
    backwards before its step (a partial window the loop cut short, an early stop, dropped
    before the next window began: the step received K whole micro-steps)."""
    cons = w.conservation
    if cons is None or cons.ok or cons.reason != "wiped":
        return 0
    j = cons.first_wipe
    n = w.window
    if not (isinstance(j, int) and 0 < j < n and int(w.zero_grads_between)):
        return 0
    if j in (w.data_pass_starts or []):
        return j
    if k is not None and k > 1 and n - j == k and not w.data_pass_starts \
            and int(w.zero_grads_between) == 1:
        return j
    return 0


def dropped_finding(rank: int, w: StepWindow, j: int, k: int | None) -> Finding:
    """F7 for a tail of ``j`` micro-steps cleared at the next pass's start: a warning when
    the step that follows received K whole micro-steps of the new pass (the update is the
    large batch's for them; the tail's data was not trained on), an error otherwise."""
    cons = w.conservation
    assert cons is not None  # (:func:`dropped_tail` found the wipe)
    n = w.window
    if j not in (w.data_pass_starts or []):  # (no DataLoader pass: a window cut short)
        head = (f"{j} micro-step(s) after optimizer step {_n(w.step - 1) if w.step else 0} "
                f"were never stepped: zero_grad() cleared their gradient "
                f"({cons.wiped:.3g} of the window's gradient, relative, removed before "
                f"backward pass {j + 1}), so optimizer step {_n(w.step)} received only the "
                f"{n - j} micro-step(s) after it")
        return _mk("F7", "warning", rank, w.step, j - 1,
                   f"{head}, a whole window of K = {k}: that update is the large batch's, "
                   f"but the {j} micro-batch(es) of the window cut short (a loop that broke "
                   "off mid-window, an early stop) were never trained on (as with "
                   "drop_last=True). Fine if intended",
                   title_=f"a partial window ({j} micro-batch(es)) dropped by zero_grad() "
                          "before the next window: data not trained on",
                   fix="To train on it, step on the partial window when the loop breaks off, "
                       "its loss normalised by its own count; to drop it, nothing to change.")
    head = (f"{j} micro-step(s) at the end of a pass over the DataLoader (an epoch) were "
            f"never stepped: zero_grad() at the start of the next pass cleared their "
            f"gradient ({cons.wiped:.3g} of the window's gradient, relative, removed "
            f"before backward pass {j + 1}), so optimizer step {_n(w.step)} received only "
            f"the {n - j} micro-step(s) of the new pass")
    if k is not None and n - j == k:
        return _mk("F7", "warning", rank, w.step, j - 1,
                   f"{head}, a whole window of K = {k}: that update is the large batch's, "
                   f"but the epoch's last {j} micro-batch(es) were never trained on (as "
                   "with drop_last=True on the large batch). Fine if intended",
                   title_=f"an epoch's partial window ({j} micro-batch(es)) dropped by "
                          "zero_grad() at the next epoch's start: data not trained on",
                   fix="To train on the tail, step after the last micro-batch of each pass "
                       "with its loss normalised by the tail's own count; to drop it on "
                       "purpose, say so with drop_last=True on the DataLoader.")
    return _mk("F7", "error", rank, w.step, j - 1,
               f"{head}: the partial window was dropped"
               + (f", and the step came after {n - j} micro-step(s), not K = {k}"
                  if k is not None else "")
               + ". Step (normalised by its own count) after the last micro-batch of each "
                 "pass")


def scheduled_ks(windows: list[StepWindow], changes: Sequence[Sequence[int]]
                 ) -> list[int | None]:
    """Per window, the K the framework had set when it began (``changes``: ``[backwards so
    far, K]`` at each epoch's start); None before the first change."""
    marks = sorted((int(b), int(k)) for b, k in changes)
    ks: list[int | None] = []
    done = 0
    for w in windows:
        ks.append(next((k for b, k in reversed(marks) if b <= done), None))
        done += int(w.window)
    return ks


def scheduled_tail_findings(rank: int, windows: list[StepWindow],
                            changes: Sequence[Sequence[int]],
                            by: str = "Lightning's GradientAccumulationScheduler") -> list[Finding]:
    """K set per epoch by the framework (``changes``: ``[backwards so far, K]`` at each
    epoch's start, Lightning's ``GradientAccumulationScheduler``, or the script's own setting
    of Accelerate's K: ``by``): a window of n < K
    micro-steps that ends a pass over the DataLoader (or that K's run of windows), after
    full windows of the same K whose loss weighed one same total, and whose own loss
    weighed n/K of it: divided by K instead of its n micro-steps (F7, an error)."""
    ks = scheduled_ks(windows, changes)
    masses = [_f7_mass(w) for w in windows]
    for i, (w, m, k) in enumerate(zip(windows, masses, ks, strict=True)):
        n = int(w.window)
        if m is None or k is None or k < 2 or not 1 <= n < k:
            continue
        nxt = windows[i + 1] if i + 1 < len(windows) else None
        if nxt is not None and 0 not in (nxt.data_pass_starts or []) and ks[i + 1] == k \
                and nxt.opt_serial == w.opt_serial:
            continue  # not the end of a pass, of that K's epochs or of that optimizer's run
        full = [fm for fw, fm, fk in zip(windows[:i], masses[:i], ks[:i], strict=True)
                if fk == k and fm is not None and int(fw.window) == k and fw.opt_serial == w.opt_serial]
        if not full:
            continue
        ref = sum(f.mass for f in full) / len(full)
        if ref <= 0 or not all(_near(f.mass, ref, f.low) for f in full) \
                or not _near(m.mass, n / k * ref, m.low):
            continue
        return [_mk("F7", "error", rank, w.step, n - 1,
                    f"{m.words(n, k, at=False)}: the last window before optimizer step "
                    f"{_n(w.step)} had {n} of the K = {k} micro-steps set for that epoch "
                    f"(by {by}), while each of "
                    f"the {len(full)} full window(s) of that K weighed {ref:.4g}: the short "
                    f"window was divided by K instead of its {n} micro-steps, so its update "
                    f"is {n}/{k} of its mean gradient",
                    fix=("Normalise each window's loss by its own size: in training_step, "
                         "multiply the loss by K / (the batches left in the epoch's last "
                         "window) there, or use a K that divides the batches per epoch."
                         if "Lightning" in by else
                         "Normalise each window's loss by its own size (divide by the window's "
                         "micro-batch count, not K), or use a K that divides the batches per "
                         "epoch."))]
    return []
