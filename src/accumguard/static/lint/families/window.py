"""Window rules: what must happen only at the boundary but runs on every micro-step.

AG101 (F1) optimizer step, AG102 (F3) zero_grad, AG105 (F8) clipping. When the
optimizer itself steps every micro-step (AG101) the zero_grad and clipping next
to it are consistent with that step: one root cause, one finding.
"""

from __future__ import annotations

import ast
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


def _grad_clears(ctx: FileContext, window: ast.AST) -> Iterator[ast.AST]:
    """``p.grad = None`` / ``p.grad.zero_()`` / ``p.grad.data.zero_()`` in the window, in a loop
    that does nothing else with ``.grad`` (a loop that first copies ``p.grad`` into its own
    buffer accumulates by hand and clears on purpose)."""
    for n in ctx.local_nodes(window):
        target: ast.AST | None = None
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value is None:
            target = next((t for t in n.targets if isinstance(t, ast.Attribute) and t.attr == "grad"), None)
        elif isinstance(n, ast.Call) and call_attr(n) in ("zero_", "detach_") and isinstance(n.func, ast.Attribute):
            inner = n.func.value
            if isinstance(inner, ast.Attribute) and inner.attr == "data":
                inner = inner.value
            if isinstance(inner, ast.Attribute) and inner.attr == "grad" and call_attr(n) == "zero_":
                target = inner
        if target is None:
            continue
        loop = ctx.enclosing(n, (ast.For, ast.AsyncFor))
        if loop is None or loop is window:
            continue
        other_reads = [
            a for a in ctx.local_nodes(loop)
            if isinstance(a, ast.Attribute) and a.attr == "grad" and a is not target
            and not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and a is n.func.value)
        ]
        if not other_reads:
            yield n


@rule("AG102")
def grads_cleared_by_hand_in_window(ctx: FileContext) -> Iterator[Finding]:
    """``for p in model.parameters(): p.grad = None`` on every micro-step: zero_grad by hand."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.unguarded_optimizer_steps or facts.summed_loss:
            continue
        for node in _grad_clears(ctx, window):
            if ctx.guarded(node, window):
                continue
            yield ctx.finding(
                "AG102",
                node,
                "the parameters' `.grad` is cleared on every micro-batch (a hand-written zero_grad): "
                "only the last micro-batch reaches the optimizer",
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
