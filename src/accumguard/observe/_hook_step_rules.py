"""F1 for an optimizer stepped from a gradient hook ("optimizer in backward", e.g.
``register_post_accumulate_grad_hook`` calling ``opt.step()``).

Such steps are cut by the backward pass they run in, so no window rule reads them
(:class:`~accumguard.observe._records.RunRecording` sets them apart). One question can
still be answered exactly: did an optimizer step inside *every* backward pass of the run
while the run declares K > 1 (a flag, the framework at run time, or a script whose loss is
divided by its K)? Then each micro-batch's gradient was applied on its own, never summed
over a window of K: the update is not the large batch's. A hook gated on the window's last
micro-batch steps in one backward pass of K, and a run that declares no K is not judged.

The passes that ran a step also give the windows' sizes: a first window shorter than K
followed by windows of exactly K (at least two) is F13, the hook's boundary test counting
from the wrong origin (``micro % K == 0`` with the counter from 0).
"""

from __future__ import annotations

from accumguard.observe._records import Finding, KResolution, RunRecording, _mk, _windows

__all__ = ["in_backward_findings"]

_FIX = ("step from the hook only on the window's last micro-batch (e.g. a flag the loop sets "
        "before the K-th backward, which the hook reads), zero the gradients after that step, "
        "and keep the loss divided by K; or step the optimizer after the loop's K-th backward "
        "instead of from the hook")


def in_backward_findings(rec: RunRecording, res: KResolution) -> list[Finding]:
    """F1 (error) per rank whose every backward pass ran an optimizer step, K > 1 declared."""
    k, script = res.k, res.script
    if k is None or k <= 1:
        return []
    if res.strength in ("flag", "runtime"):
        why = f"K = {k} ({res.source})"
    elif res.strength == "script" and script is not None and script.divides_loss:
        why = (f"the script declares K: {script.describe()}; each step applies one "
               f"micro-batch's gradient divided by {k}")
    else:
        return []
    out = []
    for rank, passes in sorted(rec.in_backward_passes.items()):
        total = int((rec.end.get(rank) or {}).get("backwards_total") or 0)
        if total >= 2 and len(passes) < total:
            out += _cadence(rec, rank, passes, total, k, f"K = {k}, {res.source}")
        if total < 2 or len(passes) < total:
            continue
        out.append(_mk("F1", "error", rank, 0, 0,
                       f"an optimizer stepped inside each of the {total} backward passes "
                       "(from a gradient hook, e.g. register_post_accumulate_grad_hook: an "
                       f"optimizer in backward), while {why}: the micro-batches' gradients "
                       f"are never summed over a window of {k}",
                       title_="optimizer in backward steps on every micro-batch",
                       fix=_FIX))
    return out


def _cadence(rec: RunRecording, rank: int, passes: set[int], total: int, k: int,
             why: str) -> list[Finding]:
    """F13 when the in-backward steps' windows are a short first one, then K each."""
    outside = sum(w.window for w in _windows(rec.steps.get(rank, [])) if w.window > 0)
    first_outside = total - outside  # (steps outside backward: a later phase's passes)
    order = sorted(p for p in passes if p < first_outside)
    if len(order) < 3:
        return []
    sizes = [order[0] + 1] + [b - a for a, b in zip(order, order[1:], strict=False)]
    if not (sizes[0] < k and all(n == k for n in sizes[1:])):
        return []
    left = first_outside - 1 - order[-1]
    return [_mk("F13", "error", rank, 0, sizes[0] - 1,
                f"an optimizer stepped inside backward (a gradient hook) first in backward pass "
                f"{order[0] + 1}, after {sizes[0]} of K micro-batches, then every {k} passes "
                f"({len(sizes)} steps; {why}): the hook's boundary test counts from the wrong "
                "origin (e.g. `micro % K == 0` with the counter from 0), so every window is "
                "shifted by one: the first holds "
                f"{sizes[0]} micro-batch(es) divided by K"
                + (f", and the {left} backward pass(es) after the last step never reach one"
                   if left > 0 else ""),
                title_="optimizer in backward: windows shifted (the first one short)",
                fix="test the window's last micro-batch in the hook, `(micro + 1) % K == 0` "
                    "with the counter from 0 (or `micro % K == 0` counted after the increment)")]
