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

from accumguard.observe._records import Finding, KResolution, StepWindow, _mk
from accumguard.observe._weight_rules import loss_divisor

__all__ = ["accelerate_double_gate"]


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
