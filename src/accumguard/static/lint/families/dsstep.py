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
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.deepspeed import engine_ga_above_one

__all__ = ["engine_step_never_called"]


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
