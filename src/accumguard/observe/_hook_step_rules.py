"""F1 for an optimizer stepped from a gradient hook ("optimizer in backward", e.g.
``register_post_accumulate_grad_hook`` calling ``opt.step()``).

Such steps are cut by the backward pass they run in, so no window rule reads them
(:class:`~accumguard.observe._records.RunRecording` sets them apart). One question can
still be answered exactly: did an optimizer step inside *every* backward pass of the run
while the run declares K > 1 (a flag, the framework at run time, or a script whose loss is
divided by its K)? Then each micro-batch's gradient was applied on its own, never summed
over a window of K: the update is not the large batch's. A hook gated on the window's last
micro-batch steps in one backward pass of K, and a run that declares no K is not judged.
"""

from __future__ import annotations

from accumguard.observe._records import Finding, KResolution, RunRecording, _mk

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
