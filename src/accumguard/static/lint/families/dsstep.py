"""AG188 (F10): a DeepSpeed engine whose ``engine.step()`` is never called, its optimizer
stepped directly.

DeepSpeed counts micro-steps in ``engine.step()``: with ``gradient_accumulation_steps`` above
1 a backward is an accumulation boundary only after ``engine.step()`` has advanced the
counter to it, and the engine reduces the gradients over the ranks there (ZeRO-0 all-reduces
at the boundary, ZeRO-1/2 reduce in the boundary's backward). A loop that calls
``engine.backward(loss)`` and then steps the client optimizer itself (``optimizer.step()``,
gated by hand or not) never advances the counter: no backward is ever a boundary, nothing is
reduced, and each rank steps on its own gradient. Reported when the file calls
``deepspeed.initialize`` itself, ``engine.backward`` and an optimizer's ``step()``, never an
engine's ``step()``, and its DeepSpeed config sets gradient_accumulation_steps above 1 (an
engine made by Accelerate or the HF Trainer is stepped through their optimizer wrapper).

AG349 (F1): the loop accumulates by hand (``engine.no_sync()`` on all but a window's last
micro-batch) while the config's gradient_accumulation_steps is 1 and ``engine.step()`` runs
after every backward: with GA 1 every ``engine.step()`` is a boundary, so the engine steps
(on that rank's own, unreduced gradient inside ``no_sync``) after every micro-batch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.deepspeed import engine_ga_above_one

__all__ = ["engine_step_never_called", "engine_steps_inside_hand_window"]


@rule("AG188")
def engine_step_never_called(ctx: FileContext) -> Iterator[Finding]:
    if not ctx.deepspeed:
        return
    calls = [c for c in ctx.of(ast.Call) if isinstance(c, ast.Call)]
    if not any(call_attr(c) == "initialize" and (dotted(c.func) or "").startswith("deepspeed")
               for c in calls):
        return  # (an engine Accelerate or the HF Trainer made steps through their wrapper)
    backwards = [c for c in calls if call_attr(c) == "backward" and isinstance(c.func, ast.Attribute)
                 and ctx.kind_of_receiver(c.func.value) == "engine"
                 and not ctx.is_accelerator(c.func.value)]
    if not backwards or any(ctx.is_step(c, ("engine",)) for c in calls):
        return
    steps = [c for c in calls if ctx.is_step(c, ("optimizer",))]
    if not steps or not engine_ga_above_one(ctx):
        return
    name = dotted(steps[0].func.value) if isinstance(steps[0].func, ast.Attribute) else None
    yield ctx.finding(
        "AG188",
        steps[0],
        f"`{name or 'optimizer'}.step()` steps the optimizer directly after "
        f"`{ast.unparse(backwards[0].func)}(...)` (line {backwards[0].lineno}), and the file never "
        "calls the engine's step(): DeepSpeed advances its micro-step counter in engine.step(), "
        "so with gradient_accumulation_steps above 1 no backward is ever an accumulation "
        "boundary, the engine never reduces the gradients over the ranks, and each rank steps "
        "on its own gradient",
    )


def _conditional_no_sync(fn: ast.AST) -> ast.IfExp | ast.If | None:
    """The ``if``/conditional expression in ``fn`` that chooses ``engine.no_sync()`` on a
    condition (a window's non-last micro-batches)."""
    for n in ast.walk(fn):
        if isinstance(n, ast.IfExp | ast.If) and any(
                isinstance(c, ast.Call) and call_attr(c) == "no_sync"
                for part in ((n.body, n.orelse) if isinstance(n, ast.IfExp) else (*n.body, *n.orelse))
                for c in ast.walk(part)):
            return n
    return None


@rule("AG349")
def engine_steps_inside_hand_window(ctx: FileContext) -> Iterator[Finding]:
    ref = ctx.ds_config() if ctx.deepspeed else None
    if ref is None or ref.ga != 1:
        return
    for fn in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef):
        gate = _conditional_no_sync(fn)
        if gate is None:
            continue
        for c in ast.walk(fn):
            if not (isinstance(c, ast.Call) and call_attr(c) == "step" and isinstance(c.func, ast.Attribute)
                    and ctx.kind_of_receiver(c.func.value) == "engine"):
                continue
            around = ctx.enclosing(c, (ast.If, ast.IfExp, ast.FunctionDef, ast.AsyncFunctionDef))
            if around is not fn:
                continue  # stepped under a condition: the loop's own boundary
            scope = (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)
            if ctx.enclosing(c, scope) is not ctx.enclosing(gate, scope):
                continue  # stepped once after a loop over the window's micro-batches
            yield ctx.finding(
                "AG349", c,
                f"`{ast.unparse(c.func)}()` runs after every backward, but the loop accumulates "
                f"by hand (`no_sync()` under `{ast.unparse(gate.test)}`, line {gate.lineno}) "
                f"while the DeepSpeed config's gradient_accumulation_steps is 1 ({ref.where}): "
                "every engine.step() is then a boundary, so the engine steps after every "
                "micro-batch, on each rank's own gradient inside no_sync",
                fix="call engine.step() only at the window's last micro-batch (where no_sync is "
                    "off), or drop the hand window and set gradient_accumulation_steps to K "
                    "(then engine.step() after every backward is right)")
            return
