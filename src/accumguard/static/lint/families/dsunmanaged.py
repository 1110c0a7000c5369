"""``managed_gradient_accumulation: false`` under DeepSpeed's own loop (F1): AG305.

With ``managed_gradient_accumulation`` false DeepSpeed leaves the boundary to the caller:
every ``engine.step()`` is one. The usual DeepSpeed loop, ``engine.backward(loss);
engine.step()`` on every micro-batch, then steps the optimizer on every micro-batch while the
config asks for ``gradient_accumulation_steps`` K > 1: no accumulation, K times the steps.
Silent when the step is gated (the caller's boundary, what the setting is for) or the config
sets GA 1.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.deepspeed import engine_ga_above_one

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _calls(stmt: ast.stmt, name: str) -> list[ast.Call]:
    """Calls ``X.name(...)`` in a statement, not inside a nested block of it."""
    if isinstance(stmt, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign):
        return [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and call_attr(n) == name]
    return []


@rule("AG305")
def unmanaged_engine_steps_every_micro_batch(ctx: FileContext) -> Iterator[Finding]:
    ref = ctx.ds_config()
    if ref is None or ref.managed is not False or not engine_ga_above_one(ctx):
        return
    for loop in ctx.of(*_LOOPS):
        body = list(loop.body)
        backs = [i for i, s in enumerate(body) if _calls(s, "backward")]
        steps = [(i, c) for i, s in enumerate(body) for c in _calls(s, "step")]
        if not backs or not any(i > backs[0] for i, _ in steps):
            continue
        i, site = next((i, c) for i, c in steps if i > backs[0])
        name = dotted(site.func.value) if isinstance(site.func, ast.Attribute) else None
        yield ctx.finding(
            "AG305", site,
            f"`{name or 'engine'}.step()` runs after every backward of the loop while the "
            f"DeepSpeed config ({ref.where}) sets managed_gradient_accumulation false: every "
            "step() is then a boundary, so the optimizer steps on every micro-batch and "
            "the config's gradient_accumulation_steps never accumulates")
