"""F8 from the script's post-accumulate-grad hooks (pure Python, no torch): a hook that
multiplied a parameter's accumulated ``.grad`` by a scalar inside a backward before the
window's last (``StepRecord.grad_rescaled``, measured by :mod:`._grad_hooks`).

Inside backward i of a window, ``.grad`` holds the sum of the first i micro-batches'
gradients; a hook scaling it by c there weighs those micro-batches c against the ones
after it, which no large batch does (its gradient is the plain sum, clipped once if at
all after the last). A per-parameter clip registered this way (``p.grad.mul_(max / norm)``
when the norm is over the limit) is the usual form: c < 1 whenever it cut. Only a factor
measured as one scalar on the whole gradient counts; a hook that changed ``.grad`` otherwise
(an all-reduce, a clamp) is not read here. Rescales inside the window's last backward act
on the whole window (a per-parameter clip of the full sum: legal) and are not judged; a
window with a clipping call between its backwards is the clip rules'.
"""

from __future__ import annotations

from accumguard.observe._records import Finding, StepWindow, _mk, _n

__all__ = ["grad_rescale_findings"]


def grad_rescale_findings(rank: int | None, windows: list[StepWindow]) -> list[Finding]:
    """F8 for the first window whose hook rescaled a partial window sum (module doc)."""
    for w in windows:
        n = int(w.backwards)
        rows = [r for r in (w.grad_rescaled or []) if int(r[0]) < n - 1]
        if n < 2 or int(w.window) < 2 or not rows or int(w.zero_grads_between) \
                or any(0 < int(c) < n for c in w.clip_micros or []):
            continue
        lo = min(float(r[3]) for r in rows)
        hi = max(float(r[4]) for r in rows)
        passes = [int(r[0]) + 1 for r in rows]
        params = max(int(r[1]) for r in rows)
        factor = f"{lo:.3g}" if abs(hi - lo) <= 1e-6 * max(abs(hi), 1e-30) \
            else f"{lo:.3g} to {hi:.3g}"
        return [_mk("F8", "error", rank, w.step, None,
                    f"a gradient hook registered with register_post_accumulate_grad_hook "
                    f"multiplied the accumulated .grad of {params} parameter(s) by {factor} "
                    f"inside backward pass(es) {passes[:6]}{' ...' if len(passes) > 6 else ''}"
                    f" of the {n} of optimizer step {_n(w.step)} (the ratio of the "
                    f"gradient's 2- and 4-norms after and before the hook: one scalar); "
                    f"there .grad holds only the window's first micro-batches, so they are "
                    f"scaled against the later ones, where the large batch's gradient is "
                    f"their plain sum, clipped once after the last backward if at all",
                    title_="a gradient hook rescales the accumulated gradient inside the "
                           "window (a per-parameter clip on every micro-step)",
                    fix="Clip once per optimizer step, after the window's last backward (and "
                        "after the gradients are synchronised): move the per-parameter clip "
                        "out of the post-accumulate-grad hook into the step (loop over the "
                        "parameters before optimizer.step()), or have the hook act only on "
                        "the window's last micro-step.")]
    return []
