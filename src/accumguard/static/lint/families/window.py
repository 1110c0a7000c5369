"""Window rules: what must happen only at the boundary but runs on every micro-step.

AG101 (F1) optimizer step, AG102 (F3) zero_grad, AG105 (F8) clipping. When the
optimizer itself steps every micro-step (AG101) the zero_grad and clipping next
to it are consistent with that step: one root cause, one finding.
"""

from __future__ import annotations

from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.registry import rule


@rule("AG101")
def step_every_micro_step(ctx: FileContext) -> Iterator[Finding]:
    """An optimizer step in an accumulation window with no boundary condition."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if facts.summed_loss:
            continue  # the inner loop sums losses into one backward: K = 1
        for call in facts.unguarded_optimizer_steps:
            name = dotted(receiver(call)) or "optimizer"
            yield ctx.finding(
                "AG101",
                call,
                f"`{name}.step()` runs on every micro-batch of this accumulation loop (line "
                f"{getattr(window, 'lineno', '?')}) with no boundary condition: the optimizer takes K "
                "small steps instead of one",
            )


@rule("AG102")
def zero_grad_in_window(ctx: FileContext) -> Iterator[Finding]:
    """zero_grad (optimizer's or model's) on every micro-step of an accumulation window."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.unguarded_optimizer_steps or facts.summed_loss:
            continue
        for call, kind in facts.zero_grads:
            if ctx.guarded(call, window) or (facts.accelerate and kind == "optimizer"):
                continue
            name = dotted(receiver(call)) or "model"
            extra = (
                " (Accelerate gates the prepared optimizer's zero_grad, not the model's)"
                if facts.accelerate
                else ""
            )
            yield ctx.finding(
                "AG102",
                call,
                f"`{name}.zero_grad()` on every micro-batch erases the gradients accumulated so far: "
                f"only the last micro-batch reaches the optimizer{extra}",
            )


@rule("AG105")
def clip_in_window(ctx: FileContext) -> Iterator[Finding]:
    """Clipping / unscale_ on every micro-step (not under DeepSpeed, which clips inside step)."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if (
            not facts.accumulating
            or facts.unguarded_optimizer_steps
            or facts.engine_steps_unguarded
            or facts.summed_loss
        ):
            continue
        for call in facts.clips:
            if ctx.guarded(call, window):
                continue
            yield ctx.finding(
                "AG105",
                call,
                f"`{call_attr(call)}` runs on every micro-batch: it acts on a partial (and, under "
                "no_sync, unsynchronised) gradient; clip once on the full gradient at the boundary",
            )
