"""F4 for a learning-rate schedule written by hand: no scheduler object, the value itself,
or a scheduler given its position (``scheduler.step(epoch)``), whose calls are not its steps.

:mod:`._lr_trace` records, per window, how often the optimizers' learning rates changed
between two backward passes (``lr_changes``) and the rate at the step (``lr``). A schedule
indexed by the optimizer step changes the rate between windows only; one indexed by the
micro-step changes it between every two backward passes. Only the rate at the step reaches
the update, so that is wrong only when the schedule's lengths count optimizer steps (it then
advances K times per step); a schedule counting data consumed (minGPT's tokens, micro-batches)
with its lengths in the same units gives each step the large batch's rate. An error when
the run shows it (the rate stopped changing at 1/K of the run: a horizon counted in
optimizer steps, reached K times early); a warning saying both readings otherwise.
"""

from __future__ import annotations

from accumguard.observe._records import Finding, StepWindow, _mk

__all__ = ["lr_schedule_findings"]

_TITLE = "learning-rate schedule advanced per micro-step (written by hand, no scheduler)"

_TITLE_UNSEEN = ("learning rate rewritten between backward passes (written by hand): K x "
                 "fast if its schedule counts optimizer steps")

_TITLE_SET = ("learning-rate schedule placed per micro-step (scheduler.step(position)): "
              "K x fast")

_TITLE_SET_UNSEEN = ("learning rate placed between backward passes (scheduler.step(position)):"
                     " K x fast if its position counts optimizer steps")

_FIX_UNSEEN = ("If the schedule's lengths count optimizer steps, compute the rate once per "
               "optimizer step from the optimizer-step counter (nanoGPT style: lr = "
               "get_lr(iter_num) before the micro-step loop, iter_num += 1 after "
               "optimizer.step()); a schedule counting tokens or micro-batches with lengths in "
               "the same units needs no change")

_FIX = ("Compute the learning rate once per optimizer step from the optimizer-step counter "
        "(nanoGPT style: lr = get_lr(iter_num) before the micro-step loop, iter_num += 1 "
        "after optimizer.step()), or count the schedule's warmup and decay in micro-steps")


def lr_schedule_findings(rank: int, windows: list[StepWindow], k: int | None
                         ) -> list[Finding]:
    """The finding for a hand-written schedule stepped per micro-step, or none.

    ``windows``: a rank's applied step records (:func:`._records._windows`), one optimizer.
    Judged only when every window in which the rate moved moved it between every two of
    its backward passes, or at least twice (a single in-window change is a schedule update
    that happened to fall mid-window, and a window whose rate moved only at its step is
    step-indexed)."""
    # one optimizer object's windows: a later object (a reference run after the training)
    # has its own rates and its own count of steps
    serials = [w.opt_serial for w in windows if w.lr_changes]
    if serials and serials[0] is not None:
        windows = [w for w in windows if w.opt_serial == serials[0]]
    if len({w.optimizer_index for w in windows if w.optimizer_index is not None}) > 1:
        return []  # (several optimizers on their own windows: the trace reads them all)
    traced = [(w, w.lr_changes, w.lr) for w in windows
              if w.lr_changes is not None and w.lr is not None]
    if len(traced) < 3:
        return []
    if any(w.lr_changes and w.scheduler_steps for w, _, _ in traced):
        return []  # a scheduler object moved the rate inside a window: the scheduler rule's
    # per window whose rate moved: (index, True when it moved between every two backwards)
    moving: list[tuple[int, bool]] = []
    prev: float | None = None
    for i, (w, lr_changes, rate) in enumerate(traced):
        n, changes, lr = int(w.backwards or 0), int(lr_changes), float(rate)
        if changes or (prev is not None and lr != prev):
            # (two changes inside one window: no schedule indexed by the optimizer step moves
            # twice between two steps, whether or not the rate reached its floor mid-window)
            moving.append((i, (n >= 2 and changes >= n - 1) or changes >= 2))
        prev = lr
    # the schedule's first and last moves may fall part-way into a window or on its
    # boundary (a warm-up reaching its peak, a decay reaching its floor: at most two windows
    # before the first window that moved at every backward, and two after the last); a move
    # between such windows that was not at every backward is a schedule indexed by the
    # optimizer step
    full = [i for i, every in moving if every]
    if not full:
        return []
    partial = [i for i, every in moving if not every]
    lead = [i for i in partial if i < full[0]]
    tail = [i for i in partial if i > full[-1]]
    # one window between them that missed one change (a warm-up's peak equal to the decay's
    # first value: the rate held for one backward) is still indexed by the micro-step
    mid = [i for i in partial if full[0] < i < full[-1]]
    if len(mid) > 1 or any(int(traced[i][1]) < max(1, int(traced[i][0].backwards or 0) - 2)
                           for i in mid):
        return []
    if len(lead) > 2 or len(tail) > 2 or len(lead) + len(tail) + len(mid) != len(partial):
        return []
    if len(moving) < 2 and int(traced[full[0]][0].backwards or 0) < 3:
        return []  # (one change in one window of two backwards: a coincidence is possible)
    per_micro = len(full)
    positioned = any(int(w.scheduler_positioned or 0) for w, _, _ in traced)
    last_move = moving[-1][0]
    sizes = sorted(int(w.backwards or 0) for w, _, _ in traced)
    kk = k if k is not None and k > 1 else sizes[len(sizes) // 2]
    total = len(traced)
    first = traced[full[0]][0]  # (the example: a window that moved at every backward)
    every = all(int(w.lr_changes or 0) >= int(w.backwards or 0) - 1 for w, _, _ in
                (traced[i] for i in full))
    where = ((f"the learning rate changed between every two backward passes of {per_micro} "
              if every else
              f"the learning rate changed more than once between two optimizer steps in "
              f"{per_micro} ")
             + f"window(s) (e.g. {first.lr_changes} change(s) among the {first.backwards} "
             "backward passes of one), "
             + ("set by an LR scheduler given its position (scheduler.step(epoch)) between "
                "them: the position given is indexed by the micro-step and advances"
                if positioned else
                "with no LR scheduler stepping inside them: the schedule written into "
                "param_groups is indexed by the micro-step and advances")
             + f" {kk} x per optimizer step")
    ended = last_move + 1  # optimizer steps until the rate stopped moving
    flat = total - ended
    if kk > 1 and flat >= 2 and abs(ended - total / kk) <= 1:
        step = traced[ended][0].step
        return [_mk("F4", "error", rank, step, None,
                    f"{where}; it stopped changing after optimizer step {ended} of {total} "
                    f"(about {total} / {kk}): a schedule whose horizon counts optimizer "
                    f"steps reached its end {kk} x early, and the remaining {flat} steps ran "
                    f"at its final rate", fix=_FIX, title_=_TITLE_SET if positioned else _TITLE)]
    step = first.step
    seen = where.replace(" is indexed by the micro-step and advances", " moves")
    return [_mk("F4", "warning", rank, step, None,
                f"{seen}. Only the rate at the step reaches the update. If the schedule counts "
                f"optimizer steps (its warm-up and decay lengths in steps), it advances {kk} x "
                f"per step and its warm-up and decay come {kk} x early. If it counts data "
                "consumed (micro-batches, tokens or samples, as minGPT's token schedule does) "
                "with its lengths in the same units, the rate at each step is the large "
                "batch's. The run did not reach the schedule's end, so which one is not seen: "
                "a warning, not an error",
                fix=_FIX_UNSEEN, title_=_TITLE_SET_UNSEEN if positioned else _TITLE_UNSEEN)]
