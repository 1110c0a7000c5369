"""Several optimizers over disjoint parameters, judged each on its own windows: a rank's step
lines per optimizer (``optimizer_index``) and the K each group is judged with (the declared
K, an optimizer at its own rate, or each one's inferred K)."""

from __future__ import annotations

from collections import Counter

from accumguard.core.findings import Finding
from accumguard.observe._records import JsonObject, KResolution, StepWindow, _mk, _n, _windows
from accumguard.observe._weight_rules import loss_divisor

__all__ = ["OwnRate", "after_in_backward", "group_ks", "optimizer_groups"]


class OwnRate:
    """The note for an optimizer that steps after every backward reaching its parameters
    while another accumulates the declared K (its rank filled in per rank)."""

    def __init__(self, cls: str, step: int, evidence: str, title: str | None = None,
                 fix: str | None = None, severity: str = "note") -> None:
        self.cls, self.step, self.evidence, self.title = cls, step, evidence, title
        self.fix, self.severity = fix, severity

    def _replace(self, rank: int) -> Finding:
        return _mk(self.cls, self.severity, rank, self.step, 0, self.evidence,
                   title_=self.title, fix=self.fix)


def _divided_by_k(windows: list[StepWindow], k: int) -> int:
    """How many of ``windows`` had loss records, every one of them divided by exactly K and
    by nothing else (the accumulation's own scaling), or, read from the backwards of a
    window shared with other optimizers (``lane_scales``), every loss of this optimizer's
    divided by K with a ``/`` (a coefficient beside it is the user's weight; a
    multiplication by 1/K is not taken: ``0.5 * mse`` at K = 2 is a value coefficient), K >= 3;
    0 when any record says otherwise."""
    seen = 0
    for w in windows:
        recs = [r for r in w.losses or [] if len(r) > 9]
        if recs:
            if any(loss_divisor(r) != float(k) for r in recs):
                return 0
            seen += 1
        elif w.lane_scales:
            if k < 3 or not all(_slash_k(c, k) for c in w.lane_scales):
                return 0
            seen += 1
    return seen


def _slash_k(consts: list[list[object]], k: int) -> bool:
    """One of the constants above a loss is a division by exactly ``k``, none other is."""
    slashes = [float(str(c)) for op, c in consts if op == "/"]
    return len(slashes) == 1 and slashes[0] == float(k)


def optimizer_groups(steps: list[JsonObject]) -> list[tuple[int | None, list[JsonObject]]]:
    """A rank's step lines per optimizer when the observer gave several optimizers over
    disjoint parameters their own windows (``optimizer_index``), else one group."""
    keys = {s.get("optimizer_index") for s in steps} - {None}
    if len(keys) < 2:
        return [(None, steps)]
    by: dict[int | None, list[JsonObject]] = {}
    prev: JsonObject | None = None
    for raw in steps:
        s = raw
        if prev is not None and prev.get("optimizer_index") != s.get("optimizer_index") \
                and prev.get("backwards") == s.get("backwards") \
                and len(prev.get("forwards") or ()) == len(s.get("forwards") or ()) \
                and set(prev.get("data_pass_starts") or ()) - set(s.get("data_pass_starts") or ()):
            # two optimizers stepped on one window, one after the other: a DataLoader pass
            # that began in it is the window's (only the first record closed took it)
            s = {**s, "data_pass_starts": sorted(set(prev.get("data_pass_starts") or ())
                                                  | set(s.get("data_pass_starts") or ()))}
        by.setdefault(s.get("optimizer_index"), []).append(s)
        prev = raw  # (as recorded: a pass start is lent to the next record only, not on)
    return sorted(by.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))


def group_ks(groups: list[tuple[int | None, list[JsonObject]]], res: KResolution
              ) -> list[tuple[int | None, list[JsonObject], KResolution, OwnRate | None]]:
    """K for each optimizer's windows. One group: the run's K. Several: each optimizer's
    K is its own. A declared K (flag, framework, script) applies to every optimizer, except
    that one stepping after each backward that reached its parameters while another
    accumulates the declared K steps at its own rate (a GAN's discriminator, a critic): a
    note, not F1. Without a declared K, each optimizer's K is inferred from its windows."""
    if len(groups) < 2:
        split = _later_phase(groups[0][1], res) if groups else None
        if split is not None:
            return split
        return [(idx, steps, res, None) for idx, steps in groups]
    inferred: dict[int | None, int | None] = {}
    for idx, steps in groups:
        sizes = [w.window for w in _windows(steps) if w.window > 0]
        inferred[idx] = Counter(sizes).most_common(1)[0][0] if sizes else None
    out: list[tuple[int | None, list[JsonObject], KResolution, OwnRate | None]] = []
    k = res.k
    for idx, steps in groups:
        inf = inferred[idx]
        if res.declared and k is not None and k > 1:
            others = [i for i, n in inferred.items() if i != idx and n == k]
            if inf == 1 and others:
                ws = _windows(steps)
                ones = sum(1 for w in ws if w.window == 1)
                name = next((str(s.get("optimizer")) for s in steps if s.get("optimizer")),
                            "optimizer")
                scaled = _divided_by_k(ws, k)
                note = OwnRate("F1", ws[0].step if ws else 0,
                                f"optimizer #{idx} ({name}) stepped after a single backward "
                                f"pass reaching its parameters in {ones} of {len(ws)} "
                                f"steps, while optimizer #{others[0]} accumulated K = {k} "
                                f"({res.source}): judged as an optimizer stepping at its own "
                                "rate (a GAN's discriminator, a critic). If it was meant to "
                                "accumulate K too, it steps on every micro-step") \
                    if not scaled else OwnRate(
                        "F1", ws[0].step if ws else 0,
                        f"optimizer #{idx} ({name}) stepped after a single backward pass "
                        f"reaching its parameters in {ones} of {len(ws)} steps, while optimizer "
                        f"#{others[0]} accumulated K = {k} ({res.source}), and the loss of "
                        f"every backward it stepped on was divided by K = {k} (read in "
                        f"{scaled} of its windows): a loss scaled for accumulating K "
                        f"micro-batches, stepped on one at a time: each of its steps "
                        f"receives 1/{k} of one micro-batch's gradient, {k} steps per window, "
                        "where the large batch takes one step on the window's gradient",
                        title=f"optimizer #{idx} steps on every micro-step a loss divided "
                              f"by K = {k}: it was meant to accumulate",
                        severity="error")
                out.append((idx, steps, KResolution(1, f"optimizer #{idx}'s own rate",
                                                    "inferred"), note))
                continue
            paced = [i for i, s in groups if i != idx and inferred[i] == k
                     and len(s) >= len(steps)]
            if inf is None and paced:
                # no backward before its steps (gradients from torch.autograd.grad, .grad set
                # by hand) and no more steps than the optimizer accumulating K: it steps once
                # per window (a probe, a critic fitted on the window), not once per micro-step
                name = next((str(s.get("optimizer")) for s in steps if s.get("optimizer")),
                            "optimizer")
                note = OwnRate("F1", steps[0].get("step", 0) if steps else 0,
                                f"optimizer #{idx} ({name}) stepped {len(steps)} time(s) on "
                                "gradients made without a backward pass (torch.autograd.grad, "
                                f".grad set by hand), no more often than optimizer "
                                f"#{paced[0]}, which accumulated K = {k} ({res.source}): "
                                "judged as stepping once per window at its own rate, not "
                                "per micro-step",
                                title=f"optimizer #{idx} steps once per window on "
                                      "torch.autograd.grad gradients: its own rate, not F1")
                out.append((idx, steps, KResolution(1, f"optimizer #{idx}'s own rate",
                                                    "inferred"), note))
                continue
            out.append((idx, steps, res, None))
        elif inf is not None:
            out.append((idx, steps, KResolution(inf, f"inferred from optimizer #{idx}'s "
                                                "windows", "inferred", res.script), None))
        else:
            out.append((idx, steps, res, None))
    return out


def _later_phase(steps: list[JsonObject], res: KResolution
                 ) -> list[tuple[int | None, list[JsonObject], KResolution, OwnRate | None]] | None:
    """One optimizer object accumulated K, and other optimizer objects (``opt_serial``)
    stepped after windows of one size K' (1: after every backward; a few shorter ones
    allowed, the tails of their own passes) before its first step or after its last: a
    second phase of the script (a large-batch reference run before or after the training,
    accumulating over one micro-batch or over the K x W micro-batches of the run's window;
    a head fine-tuned after pre-training), each of whose windows is its own. Judged apart,
    at K', with a note, instead of as steps of the training's K (F1 at K' = 1, an
    off-by-one counter otherwise). None when the steps are not so."""
    k = res.k
    serials = [s.get("opt_serial") for s in steps]
    if k is None or k < 2 or None in serials or len(set(serials)) < 2:
        return None
    starts = [i for i in range(1, len(steps)) if serials[i] != serials[i - 1]]
    if len(set(serials)) != len(starts) + 1:
        return None  # an optimizer object stepping again after another: not phases
    for cut in starts:
        for later in (True, False):
            main, other = (steps[:cut], steps[cut:]) if later else (steps[cut:], steps[:cut])
            split = _phase(main, other, k, res, later=later)
            if split is not None:
                note, k2 = split
                phase = (None, other, KResolution(
                    k2, f"the {'later' if later else 'earlier'} phase's own windows",
                    "inferred"), note)
                return [(None, main, res, None), phase] if later else [phase, (None, main, res, None)]
    return None


def _phase(main: list[JsonObject], other: list[JsonObject], k: int, res: KResolution, *,
           later: bool) -> tuple[OwnRate, int] | None:
    """The note and K' when ``main``'s windows are mostly K (or a multiple of K) and
    ``other``'s are one size K' != K (shorter tails allowed), else None."""
    sizes = Counter(w.window for w in _windows(main) if w.window > 0)
    own = Counter(w.window for w in _windows(other))
    # (the main phase's windows are K, or a multiple of it: a DeepSpeed loop gating K
    # backwards by hand around a GA = K engine steps once per K x K, F14 of its own)
    if not (sizes and sizes.most_common(1)[0][0] % k == 0 and own):
        return None
    k2, n2 = own.most_common(1)[0]
    n_other = sum(own.values())
    if k2 < 1 or k2 == k or any(size > k2 for size in own) or n2 < max(2, n_other // 2):
        return None
    first, edge = other[0], (main[-1] if later else main[0])
    name = str(first.get("optimizer") or "optimizer")
    at = _n(int(edge.get("step", 0) or 0))
    each = ("each" if n2 == n_other else f"{n2} of them") + (
        " after a single backward pass" if k2 == 1 else f" after {k2} backward passes") + (
        "" if n2 == n_other else ", the others after fewer")
    when = "a later" if later else "an earlier"
    note = OwnRate("F1" if k2 == 1 else "F13", int(first.get("step", 0) or 0),
                   f"{'after' if later else 'before'} optimizer step {at}, where the optimizer "
                   f"that accumulated K = {k} ({res.source}) stepped for the "
                   f"{'last' if later else 'first'} time, another optimizer object ({name}) "
                   f"made the run's {'last' if later else 'first'} {n_other} step(s), {each}: "
                   "judged as a phase of its own (a large-batch reference run, a "
                   f"{'second training' if later else 'warm-up'} stage) whose windows are "
                   f"{k2} backward pass(es), not as "
                   + ("micro-steps of the training's windows. If that phase was meant to "
                      "accumulate K too, it steps on every micro-step" if k2 == 1 else
                      f"windows of the training's K = {k}. If that phase was meant to "
                      f"accumulate K = {k} too, its windows are {k2} micro-steps long"),
                   title=(f"{when} phase with another optimizer steps after every "
                          "backward: judged on its own (K = 1), not F1" if k2 == 1 else
                          f"{when} phase with another optimizer steps every {k2} "
                          f"backwards: judged on its own (K = {k2}), not as windows of "
                          f"K = {k}"),
                   fix="Nothing to fix for a reference run or a stage that steps on "
                       "whole batches; if that phase was meant to accumulate K, step "
                       "its optimizer once per K backward passes.")
    return note, k2


def after_in_backward(steps: list[JsonObject], res: KResolution, passes: set[int] | None,
                      total: int) -> list[tuple[int | None, list[JsonObject], KResolution,
                                                OwnRate | None]] | None:
    """The training stepped its optimizers inside backward (a gradient hook: optimizer in
    backward), and the steps recorded outside backward all came after its last such pass, in
    windows of one size K' != K: a later phase (a large-batch reference run), judged at K'
    with a note, as :func:`_later_phase` does for optimizer objects that step outside
    backward. None when the steps are not so."""
    k = res.k
    windows = [w for w in _windows(steps) if w.window > 0]
    if not passes or k is None or k < 2 or not windows:
        return None
    sizes = Counter(w.window for w in windows)
    k2, n2 = sizes.most_common(1)[0]
    if k2 == k or any(size > k2 for size in sizes) or n2 < max(2, len(windows) // 2):
        return None
    first_outside = total - sum(w.window for w in windows)  # the passes outside come last
    if max(passes) >= first_outside:
        return None
    first = steps[0]
    name = str(first.get("optimizer") or "optimizer")
    note = OwnRate(
        "F1" if k2 == 1 else "F13", int(first.get("step", 0) or 0),
        f"the training stepped its optimizer(s) inside backward passes (gradient hooks) up to "
        f"pass {max(passes) + 1}; after them another optimizer ({name}) made the run's last "
        f"{len(windows)} step(s) outside backward, "
        + ("each after a single backward pass" if k2 == 1 else f"after {k2} backward passes")
        + f": judged as a phase of its own (a large-batch reference run) whose windows are "
        f"{k2} backward pass(es), not as micro-steps of the training's K = {k}",
        title=f"a later phase steps outside backward every {k2} backward(s): judged on its own",
        fix="Nothing to fix for a reference run; if that phase was meant to accumulate K, step "
            "its optimizer once per K backward passes.")
    return [(None, steps, KResolution(k2, "the later phase's own windows", "inferred"), note)]
