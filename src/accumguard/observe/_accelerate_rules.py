"""F14 under Accelerate, read from its own unit: ``accumulate()`` blocks (pure Python, no
torch; :mod:`.rules` runs it with the window rules).

Accelerate counts one micro-step per ``accumulate()`` block, and the observer records the
backward passes of each block of a window (``StepRecord.accelerate_blocks``), so a window
is K blocks of b backwards (``StepWindow.backwards_per_micro`` = b). A block of b > 1
backwards of full weight (two batches) is right; a block running the loop's own group of b
micro-batches, each divided by b, while Accelerate accumulates K too is the loop and
Accelerate both gating the step.
"""

from __future__ import annotations

from accumguard.observe._records import Finding, KResolution, StepWindow, _mk, _n
from accumguard.observe._weight_rules import _loss_groups, loss_divisor

__all__ = ["accelerate_double_gate", "tail_scaled_but_carried"]


def accelerate_double_gate(rank: int, windows: list[StepWindow], k: int,
                            res: KResolution) -> Finding | None:
    """F14 under Accelerate: every window is K ``accumulate()`` blocks (Accelerate's own K)
    of b > 1 backwards each, and every loss of them was divided by b x K in all (the
    script's ``/ b`` over its own loop inside the block, ``accelerator.backward``'s ``/ K``):
    the loop groups b micro-batches per block while Accelerate steps every K blocks, the two
    gates multiplied (the windows closing a pass over the data may be shorter: Accelerate
    steps at the DataLoader's end). A block running several backwards of full weight (two
    batches, each divided by Accelerate's K only) is not this."""
    if "accelerate" not in res.source.lower() or res.strength != "runtime":
        return None
    full = [w for w in windows if w.window == k]
    if not full:
        return None
    b = full[0].backwards_per_micro
    if b < 2 or any(w.backwards_per_micro != b or not w.losses
                    or any(loss_divisor(r) != float(b * k) for r in w.losses) for w in full):
        return None
    # the other windows: one (the run's last), or each the short tail of a pass over the data
    # (Accelerate steps at the end of the DataLoader), in blocks of b as well
    tails = [i for i, w in enumerate(windows) if w.window != k]
    if len(tails) > 1 and not all(
            windows[i].window < k and windows[i].backwards_per_micro == b
            and (i == len(windows) - 1 or 0 in (windows[i + 1].data_pass_starts or []))
            for i in tails):
        return None
    w = full[0]
    return _mk("F14", "error", rank, w.step, None,
               f"{len(full)} window(s) of {k} accumulate() blocks of {b} backward passes "
               f"each, every loss divided by {b * k} in all: Accelerate "
               f"(gradient_accumulation_steps = {k}) counts one micro-step per accumulate() "
               f"block and steps once every {k} blocks, while each block ran the loop's own "
               f"group of {b} micro-batches, divided by {b} by the script and by {k} again by "
               f"accelerator.backward: the optimizer steps once every {b * k} micro-batches, "
               f"not every {b}",
               title_="double gating: the loop groups micro-batches inside each accumulate() "
                      "block while Accelerate accumulates too",
               fix="gate once: build the Accelerator with gradient_accumulation_steps=1 (the "
                   "loop accumulates already), or run one micro-batch per accumulate() block "
                   "and drop the loop's own grouping and its division")


def tail_scaled_but_carried(rank: int, windows: list[StepWindow], k: int,
                            res: KResolution) -> Finding | None:
    """F7 under Accelerate: a window of K micro-steps began in one pass over the data and
    ended in the next (a pass start at micro-step j, 0 < j < K), and at one loss call, every
    micro-step seeing the same count of units, the j before the pass start each weighed K / j
    times the ones after it: the script scaled the pass's last j micro-batches as a window of
    their own (Accelerate's ``accumulate()`` closes one at the end of a prepared DataLoader),
    but Accelerate did not close it there, so they were carried into the next pass's window
    and weigh K / j times its other micro-batches. A window spanning passes whose
    micro-steps weigh alike is the large batch of its K micro-batches: not this."""
    if "accelerate" not in res.source.lower() or k < 2:
        return None
    for w in windows:
        n = int(w.window)
        j = next((int(j) for j in w.data_pass_starts or [] if 0 < int(j) < n), None)
        if n != k or j is None or int(w.zero_grads_between) or w.backwards_per_micro != 1:
            continue
        for (site, _), by_micro in sorted(_loss_groups(w).items()):
            if sorted(by_micro) != list(range(n)):
                continue
            recs = [by_micro[m] for m in range(n)]
            if len({float(r[3]) for r in recs}) != 1 or any(bool(r[5]) for r in recs):
                continue
            wts = [abs(float(r[4])) for r in recs]
            a, b = wts[0], wts[j]
            if b <= 0 or any(abs(x - a) > 1e-6 * a for x in wts[:j]) \
                    or any(abs(x - b) > 1e-6 * b for x in wts[j:]) \
                    or abs(a / b - k / j) > 1e-3 * (k / j):
                continue
            return _mk("F7", "error", rank, w.step, j - 1,
                       f"{site.rsplit('/', 1)[-1]}: the window before optimizer step {_n(w.step)} "
                       f"held {j} micro-step(s) from the end of one pass over the DataLoader "
                       f"and {n - j} from the next (K = {k}); each of the first {j} weighed "
                       f"{a / b:.3g}x each of the others at the same count of units "
                       f"({a:.4g} against {b:.4g} per unit, from the loss record): the script "
                       f"scaled the pass's last {j} micro-batches as a window of their own, "
                       "as Accelerate's accumulate() closes one at the end of a prepared "
                       "DataLoader, but Accelerate did not step there, and they were carried "
                       f"into the next pass's window, where they weigh {k / j:.3g}x its other "
                       "micro-batches. (Accelerate tests the end of the prepared DataLoader "
                       "entered last: one left unfinished, an evaluation loop broken out of, "
                       "hides the training loader's end)",
                       title_="an epoch's last micro-batches scaled as a short window but "
                              "carried into the next epoch's window: Accelerate did not step at "
                              "the end of the pass",
                       fix="Let Accelerate see the training DataLoader's end: run every other "
                           "prepared DataLoader to its end (no break out of it; iterate a "
                           "slice of its dataset instead), or iterate an unprepared one for "
                           "evaluation; or scale each micro-batch by the window Accelerate "
                           "actually makes.")
    return None
