"""A broken gradient-conservation verdict in words (pure Python): which class it proves and
where the gradient changed between the window's backward passes.

* the script's own gradient collective right before every changed backward (no wrapper, no
  ``zero_grad`` between): a reduction of the accumulated ``.grad`` inside the window, F10,
  unless every rank still received a multiple of all ranks' contributions (an average after
  every micro-batch);
* a ``zero_grad`` inside the window: F3; anything else: F2/F3 on a DeepSpeed engine (its
  reset or a clear), F3 in a torch loop (a hand-written clear, a hook, a callback), with a
  title and fix of its own when neither a ``zero_grad`` nor DeepSpeed did it.
"""

from __future__ import annotations

from accumguard.observe._records import Finding, StepWindow, _mk, _n
from accumguard.observe._shared_rules import conservation_class, grew

__all__ = ["wipe_finding"]


def wipe_finding(rank: int, w: StepWindow, n: int, after_collective: set[int],
                 averaged: bool = False) -> Finding | None:
    """The error for window ``w`` whose conservation broke between backward passes (not a
    stale gradient, not a dropped tail: the caller's); ``after_collective``: the backward
    passes (0-based) that began right after a gradient collective of the script's own;
    ``averaged``: every rank received one multiple of the sum of all ranks' contributions
    (``_rank_rules.averaged_inside_steps``), so what changed the gradient inside the window
    (a reduction, a stash put back before the step) lost nothing and there is no error
    (None)."""
    if averaged:
        # every rank received one multiple of all ranks' contributions: whatever changed
        # .grad between the backwards (a reduction, a callback that stashed each
        # micro-step's gradient and put the window's sum back before the step) lost nothing
        return None
    if _reduced_inside(w, after_collective):
        return _mk("F10", "error", rank, w.step, None, _reduced_inside_text(w),
                   title_="gradients all-reduced by hand inside the window: the accumulated "
                          ".grad changed between backward passes",
                   fix="Reduce once per window, after its last backward pass (all_reduce(SUM) "
                       "then / W), or reduce each micro-step's own gradient before it is added "
                       "to .grad (DDP with no_sync does this for you).")
    cons = w.conservation
    if _grown(w):
        return _grown_finding(rank, w)
    cls = conservation_class(cons.reason if cons is not None else None,
                             zero_grad_inside=bool(int(w.zero_grads_between)),
                             engine_reset=w.source == "deepspeed" or w.engine == "deepspeed")
    return _mk(cls, "error", rank, w.step, None, _wipe_text(w, cls, n), **_partial_wipe_words(w, cls))


def _grown(w: StepWindow) -> bool:
    """The gradient only grew between backward passes (:func:`._shared_rules.grew`)."""
    cons = w.conservation
    return cons is not None and grew(cons.reason, float(cons.lost), float(cons.added),
                                     zero_grad_inside=bool(int(w.zero_grads_between)),
                                     engine_reset=w.source != "torch" or w.engine == "deepspeed")


def _grown_finding(rank: int, w: StepWindow) -> Finding:
    cons = w.conservation
    assert cons is not None  # (_grown's)
    wipes = ", ".join(str(int(j) + 1) for j in cons.wipes)
    return _mk(
        "LOSS_SCALE", "warning", rank, w.step, None,
        f"at optimizer step {_n(w.step)} the gradient grew before backward pass(es) {wipes} "
        f"of {w.backwards} by something other than a backward (about "
        f"{100 * float(cons.added):.0f}% of the window's gradient by absolute mass; no "
        "zero_grad ran, nothing was removed): a term added to .grad on every micro-step (a "
        "hook, a callback such as Lightning's on_after_backward or the Trainer's "
        "on_substep_end) counts once per micro-step; it weighs what the large batch gives it "
        "only if it was divided by K",
        title_="something other than a backward added to the gradient between backward "
               "passes: a term added on every micro-step counts K times unless divided by K",
        fix="Add a per-update term to the gradient once per window, after its last backward "
            "(Lightning: on_before_optimizer_step; the HF Trainer: a callback's "
            "on_pre_optimizer_step; a plain loop: right before optimizer.step()), or divide "
            "what each micro-step adds by K; or add the term to the loss before its backward.")


def _reduced_inside(w: StepWindow, after_collective: set[int]) -> bool:
    """No wrapper reduces the gradient (the script's own collectives, counted from Python),
    no zero_grad ran between the backwards, and every backward that began on a changed
    gradient began right after a gradient collective of the script's (the ledger): the
    broken conservation is that reduction of the accumulated ``.grad`` inside the window,
    not a clear."""
    wipes = set(w.conservation.wipes) if w.conservation is not None else set()
    return (w.engine == "local" and not int(w.zero_grads_between) and bool(wipes)
            and wipes <= after_collective)


def _reduced_inside_text(w: StepWindow) -> str:
    cons = w.conservation
    assert cons is not None  # (the caller's)
    wipes = ", ".join(str(int(j) + 1) for j in cons.wipes)
    return (f"gradient conservation broken at optimizer step {_n(w.step)}: the accumulated "
            f"gradient changed before backward pass(es) {wipes} of {w.backwards}, each right "
            "after a gradient collective the script issued itself (no zero_grad between the "
            "backwards): a reduction of the accumulated .grad inside the window. What the "
            "optimizer received differs from "
            f"the sum of the {w.backwards} backward passes' contributions by "
            f"{100 * float(cons.received):.3g}% of that sum (relative difference of gradient "
            "checksums); an all_reduce(SUM) of the running total counts the earlier "
            "micro-batches again on every later micro-step")


def _partial_wipe_words(w: StepWindow, cls: str) -> dict[str, str]:
    """A title and fix of its own when the gradient was cleared or changed between backward
    passes by neither a ``zero_grad`` nor a DeepSpeed engine (a hook, a callback that zeroes
    some parameters' or rows' gradients): the class's "last micro-batch only" would say more
    than was measured."""
    cons = w.conservation
    if cons is None or cls not in ("F2/F3", "F3") or int(w.zero_grads_between) \
            or w.source != "torch":
        return {}  # a zero_grad inside the window (F3) or DeepSpeed's reset (F2): the class's
    lost = float(cons.lost)
    return {
        "title_": ("the gradient was cleared or changed between backward passes (no zero_grad "
                   f"ran; about {100 * lost:.0f}% of the window's gradient by mass removed): "
                   "the earlier micro-batches do not reach the optimizer in full")
        if lost >= 0.005 else
        ("the gradient was changed between backward passes (no zero_grad ran): the "
         "optimizer did not receive the sum of the micro-batches' gradients"),
        "fix": "Whatever clears or changes .grad between backward passes (a zero_grad, a hook, "
               "a callback that zeroes some parameters' or rows' gradients) must run once per "
               "window, after the last backward and before the optimizer step, or not at all: "
               "in a plain loop right before optimizer.step(); with the HF Trainer in a "
               "TrainerCallback's on_pre_optimizer_step, not on_substep_end or on_step_begin; "
               "to freeze parameters, set requires_grad=False instead.",
    }


def _wipe_text(w: StepWindow, cls: str, n: int) -> str:
    """Where the window's gradient changed between backward passes (numbered among this
    step's backward passes, which the checksums cover), and how much of it, by absolute
    mass, never reached the optimizer."""
    cons = w.conservation
    assert cons is not None  # (a broken verdict: the caller's)
    wipes = [int(j) + 1 for j in cons.wipes]
    nb = w.backwards
    off = (f"what the optimizer received differs from the sum of the {nb} backward passes' "
           f"contributions by {100 * float(cons.received):.3g}% of that sum (relative "
           "difference of gradient checksums)")
    if cls == "F3" and int(w.zero_grads_between):
        head = (f"zero_grad() ran {w.zero_grads_between} time(s) inside the window of "
                f"optimizer step {_n(w.step)}")
        how = "was cleared, in whole or in part,"
    else:
        head = f"gradient conservation broken at optimizer step {_n(w.step)}"
        how = "was changed by something other than a backward (a clear, a rescale, a reset)"
    if not wipes:  # a record from before the positions were kept
        return (f"{head}: {cons.wiped:.3g} (relative) of the window's gradient was removed "
                f"between backward passes; {off}")
    text = (f"{head}: the gradient {how} before backward pass(es) "
            f"{', '.join(map(str, wipes))} of {nb}; {off}")
    lost = float(cons.lost)
    if lost >= 0.005:
        last = wipes[-1] - 1  # backward passes 1..last ran before the last change
        before = "backward pass 1" if last == 1 else f"backward passes 1-{last}"
        text += (f"; about {100 * lost:.0f}% of the window's gradient by absolute mass, "
                 f"accumulated by {before}, was removed")
    return text
